#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 33 across hosts: a run of 2 ranks on 2 namespace hosts (scripts/netns-hosts --hosts 4), and
# an intruder on the third host (tests/multihost/intruder.py) that attacks the run's store and
# connects to every listener it sees on the ranks' hosts (as a port scan finds them). The insider's
# impostor (a second process asking for rank 1) runs on the fourth: had it won rank 1 on the
# intruder's host, the intruder would share a rank's host, and Gloo's filter admits the ranks' hosts
# (docs/security.md), which is no attack from another host.
#
#   intruders.sh gloo|stranger|insider SCENARIOS_BINARY WORK_DIR
#
# gloo: a bare Gloo group whose rank 1 arrives 4 s late, so rank 0's pair listener waits for it.
#   Made as c10d makes it, the stranger takes the listener (the control: the attack works); made
#   as backend::gloo makes it, no connection of the stranger's completes, and the group's sum is right.
# stranger: a whole training run (the scenarios program's "equivalence") with the run secret; the
#   intruder, without it, sends garbage, set and delete requests without the proof, floods and
#   stalls. The run's parameters must be bitwise those of an undisturbed run, the intruder named.
# insider: the same, by a process that proves the secret but is not a rank: it sets and deletes
#   the group's keys (rank 1's heartbeat and progress), stalls mid-request and holds idle
#   connections; and a second process asks for rank 1 as the real one starts (two workers started
#   with one RANK, or a stale process of another run with the same secret). The run must end (no
#   hang) with the undisturbed run's parameters, and the process refused rank 1 name its holder.
#
# Exits 77 (skipped) when network namespaces cannot be made, 1 with the reason on a failure.
set -euo pipefail
mode=$1 bin=$(realpath "$2") work=$3
self=$(realpath "$0")
root=$(cd "$(dirname "$self")/../.." && pwd)
fail() { echo "intruders.sh ($mode): $*" >&2; exit 1; }

if [[ ${DTRAIN_IN_HOSTS:-} == 1 ]]; then
  secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  port=29620
  limit=180 # seconds a rank may take: past it, the run hung
  [[ $mode == gloo ]] && limit=60
  steps=${DTRAIN_INTRUDER_STEPS:-250} # a few seconds of training: the intruder attacks throughout
  on() { local i=$1; shift; "$root/scripts/netns-hosts" on "$i" -- "$@"; }

  # The listeners of the ranks' hosts other than the store: what a port scan of them finds.
  watch_ports() {
    : >"$work/gloo_ports"
    while [[ ! -e $work/done ]]; do
      for i in 0 1; do
        on "$i" ss -ltnH 2>/dev/null | awk -v store=":$port" '$4 !~ store"$" && $4 !~ /^127\./ {print $4}' >>"$work/gloo_ports" || true
      done
      sleep 0.05
    done
  }
  intruder() { # the intruder on host 2, until $work/done
    on 2 /usr/bin/python3 "$root/tests/multihost/intruder.py" --store "$DTRAIN_HOST_0:$port" --gloo-ports "$work/gloo_ports" \
      --until "$work/done" --report "$work/$1.intruder" "${@:2}" >"$work/$1.intruder.log" 2>&1
  }
  # Runs rank 0 on host 0 and rank 1 on host 1 (and, for the insider, an impostor on host 3 that
  # asks for rank 1 too): run NAME ARGS...; output and exit status in NAME.host<i>.{log,status}.
  run() {
    local name=$1 i hosts=(0 1) pids=()
    shift
    [[ $name == insider ]] && hosts=(0 1 3)
    for i in "${hosts[@]}"; do
      ((i == 1)) && sleep 1 # the rendezvous waits for rank 1 a while, under attack
      on "$i" timeout "$limit" env RANK=$((i == 3 ? 1 : i)) WORLD_SIZE=2 MASTER_ADDR="$DTRAIN_HOST_0" MASTER_PORT=$port \
        DTRAIN_RUN_SECRET="$secret" "$bin" "$@" >"$work/$name.host$i.log" 2>&1 &
      pids[i]=$!
    done
    for i in "${hosts[@]}"; do
      local s=0
      wait "${pids[i]}" || s=$?
      echo $s >"$work/$name.host$i.status"
    done
  }
  attacked() { # attacked NAME [intruder flags] -- run arguments
    local name=$1 flags=()
    shift
    while [[ $1 != -- ]]; do flags+=("$1"); shift; done
    shift
    rm -f "$work/done"
    watch_ports &
    local watcher=$!
    intruder "$name" "${flags[@]}" &
    local spy=$!
    run "$name" "$@"
    touch "$work/done"
    wait "$watcher" "$spy" || true
  }

  case $mode in
    gloo)
      attacked unguarded -- gloo_group --variant unguarded --rendezvous-ms 4000
      attacked guarded -- gloo_group --rendezvous-ms 4000
      ;;
    stranger | insider)
      flags=()
      [[ $mode == insider ]] && flags=(--secret "$secret")
      mkdir -p "$work/quiet" "$work/$mode" # the same file name: torch::save names the archive after it
      run quiet equivalence --batch 2 --step-ms 20 --steps $steps --out "$work/quiet/params.pt"
      [[ $(cat "$work"/quiet.host*.status) == $'0\n0' ]] || fail "the undisturbed run failed: $(cat "$work"/quiet.host*.log)"
      attacked "$mode" "${flags[@]}" -- equivalence --batch 2 --step-ms 20 --steps $steps --out "$work/$mode/params.pt"
      ;;
  esac
  exit 0
fi

rm -rf "$work"
mkdir -p "$work"
cd "$work"
set +e
DTRAIN_IN_HOSTS=1 "$root/scripts/netns-hosts" --hosts 4 -- "$self" "$mode" "$bin" "$work" >"$work/harness.log" 2>&1
status=$?
set -e
[[ $status == 77 ]] && { cat "$work/harness.log"; exit 77; }
show() { for f in "$@"; do [[ -e $f ]] && { echo "== $f"; tail -n 15 "$f"; }; done; }
[[ $status == 0 ]] || { show "$work"/*.log; fail "the harness failed (status $status)"; }
# "gloo-connected N of M": N of the M listeners seen took the intruder's connection.
connected() { awk '$1 == "gloo-connected" {print $2}' "$1"; }
seen() { awk '$1 == "gloo-connected" {print $4}' "$1"; }

status() { cat "$work/$1.host$2.status"; }
case $mode in
  gloo)
    show "$work"/*.intruder "$work"/guarded.host*.log
    [[ $(seen unguarded.intruder) -ge 1 && $(connected unguarded.intruder) -ge 1 ]] ||
      fail "the control did not work: the stranger saw no listener of the unguarded Gloo group, or could not connect to one"
    [[ $(seen guarded.intruder) -ge 1 ]] || fail "the stranger saw no listener of the guarded Gloo group: the test proved nothing"
    [[ $(connected guarded.intruder) == 0 ]] || fail "the stranger connected to the guarded Gloo group's listeners"
    for i in 0 1; do
      [[ $(status guarded $i) == 0 ]] && grep -q "RESULT sum=3" "guarded.host$i.log" || fail "rank $i of the guarded group did not sum to 3"
    done
    ;;
  stranger | insider)
    show "$work/$mode.intruder" "$work/$mode".host*.log
    [[ $(status "$mode" 0) == 0 ]] || fail "rank 0 of the attacked run failed (status $(status "$mode" 0))"
    [[ -s $work/$mode/params.pt ]] || fail "the attacked run wrote no parameters"
    cmp -s "$work/quiet/params.pt" "$work/$mode/params.pt" || fail "the attacked run's parameters differ from the undisturbed run's"
    if [[ $mode == stranger ]]; then
      [[ $(status "$mode" 1) == 0 ]] || fail "rank 1 of the attacked run failed"
      grep -q "the rendezvous store refused a connection from 192.0.2.12:" "$mode.host0.log" ||
        fail "rank 0 did not name the stranger (192.0.2.12)"
      [[ $(awk '$1 == "unproven-requests" {print $2}' "$mode.intruder") -ge 1 ]] || fail "the stranger made no attack"
      [[ $(connected "$mode.intruder") == 0 ]] || fail "the stranger connected to a Gloo listener of the run"
    else
      [[ $(awk '$1 == "insider-set-erase" {print $2}' "$mode.intruder") -ge 1 ]] || fail "the insider made no attack"
      # One of the two processes that asked for rank 1 trained, the other was refused by name.
      [[ "$(status "$mode" 1)$(status "$mode" 3)" == 01 || "$(status "$mode" 1)$(status "$mode" 3)" == 10 ]] ||
        fail "rank 1 and its impostor ended with $(status "$mode" 1) and $(status "$mode" 3), not one 0 and one 1"
      grep -q "rank 1 of this run is already held by pid [0-9]* on dtrain-host[13]" "$mode".host[13].log ||
        fail "the process refused rank 1 did not name its holder"
    fi
    ;;
esac
echo "intruders.sh ($mode): passed"
