#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Measurements across hosts (network namespaces made by scripts/netns-hosts, as the multihost tests
# make them), printed as lines "MEASURE name value". A measurement, not a test: run it by hand.
#
#   benchmarks/multihost.sh FASHION_MNIST_BINARY WORK_DIR [STEPS]
#
# throughput (MLP, global batch 128, STEPS steps, one thread per worker), each run alternately
# REPEATS times (default 2; RECOVERY_ONLY=1 skips them):
#   dtrain_4x1   4 workers on one host, dtrain's own driver (samples/s from its JSON line)
#   dtrain_2x2   2 hosts x 2 workers under torchrun (c10d), from rank 0's metrics.jsonl
#   peer_4x1     the PyTorch DDP peer (benchmarks/peers/fashion_mnist.py, the venv's torch), its own
#                spawn of 4 workers on one host
#   peer_2x2     the same peer under the venv's torchrun, 2 hosts x 2
# recovery: 2 hosts x 2 workers under torchrun --nnodes 1:2 --max_restarts 1; once the first
#   epoch's checkpoint is written, every process of host 1 is killed (SIGKILL); host 0's agent
#   restarts its 2 workers alone from that checkpoint. recovery_s: from the kill to the restarted
#   group's first step (its first report; the example reports every step here).
# HIER_AB=1: only dtrain_2x2, with DTRAIN_HIERARCHICAL=1 and =0 alternately, REPEATS times each.
set -euo pipefail
bin=$(realpath "$1") work=$2 steps=${3:-300}
self=$(realpath "$0")
root=$(cd "$(dirname "$self")/.." && pwd)
venv_python=$root/tests/tools/venv-python # scripts/python-env's
peer=$root/benchmarks/peers/fashion_mnist.py
repeats=${REPEATS:-2}
args=(--model mlp --global-batch 128 --max-steps "$steps" --threads-per-worker 1 --quiet)
# dtrain's workers talk to the agent's store: torchrun of the torch whose LibTorch built the binary
# (Debian's 1.13); the peer's, of the venv's torch.
torchrun=(/usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --rdzv_backend c10d --redirects 2 --tee 2)
peer_torchrun=("$venv_python" -m torch.distributed.run --nproc_per_node 2 --rdzv_backend c10d --redirects 2 --tee 2)

if [[ ${DTRAIN_IN_HOSTS:-} == 1 ]]; then
  on() { "$root/scripts/netns-hosts" on "$@"; }
  both() { # PORT COMMAND...: both hosts' agents, host 0 hosting the rendezvous; waits for both
    local i pids=() agent=("${torchrun[@]}")
    [[ ${PEER_AGENT:-} == 1 ]] && agent=("${peer_torchrun[@]}")
    for i in 0 1; do
      on "$i" -- env GLOO_SOCKET_IFNAME=eth0 "${agent[@]}" --nnodes 2 --rdzv_endpoint "$DTRAIN_HOST_0:$1" \
        --rdzv_id "bench$1" --max_restarts 0 --no_python "${@:2}" >"$work/host$i-$1.log" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}"
  }
  port=29600
  if [[ ${HIER_AB:-} == 1 ]]; then  # dtrain_2x2 with the hierarchical allreduce (on) and without (off), alternately
    for r in $(seq "$repeats"); do
      for mode in 1 0; do
        DTRAIN_HIERARCHICAL=$mode both $((port++)) "$bin" "${args[@]}" --workers 4 --storage-path "$work/ab$r$mode" --name two_hosts
        python3 -c 'import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]; print("MEASURE dtrain_2x2_hierarchical_" + sys.argv[2], round(rows[-1]["train_samples_per_s"], 1))' \
          "$work/ab$r$mode/two_hosts/metrics.jsonl" "$([[ $mode == 1 ]] && echo on || echo off)"
      done
    done
    exit 0
  fi
  [[ ${RECOVERY_ONLY:-} == 1 ]] && repeats=0
  for r in $(seq "$repeats"); do
    DTRAIN_SHARED_MEMORY=1 on 0 -- "$bin" "${args[@]}" --workers 4 --storage-path "$work/r$r" --name one_host \
      | tail -n 1 | python3 -c 'import json,sys; print("MEASURE dtrain_4x1", json.load(sys.stdin)["train_samples_per_s"])'
    both $((port++)) "$bin" "${args[@]}" --workers 4 --storage-path "$work/r$r" --name two_hosts
    python3 -c 'import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]; print("MEASURE dtrain_2x2", round(rows[-1]["train_samples_per_s"], 1))' \
      "$work/r$r/two_hosts/metrics.jsonl"
    on 0 -- "$venv_python" "$peer" --model mlp --workers 4 --global-batch 128 --max-steps "$steps" \
      | tail -n 1 | python3 -c 'import json,sys; print("MEASURE peer_4x1", json.load(sys.stdin)["train_samples_per_s"])'
    PEER_AGENT=1 both $((port++)) "$venv_python" "$peer" --model mlp --workers 4 --global-batch 128 --max-steps "$steps"
    grep -h '^{' "$work"/host0-$((port - 1)).log | python3 -c 'import json,sys; print("MEASURE peer_2x2", json.loads(sys.stdin.readline())["train_samples_per_s"])'
  done

  # Recovery from a lost host: torchrun --nnodes 1:2 lets host 0 go on alone.
  run=$work/recovery/lost
  for i in 0 1; do
    on "$i" -- env GLOO_SOCKET_IFNAME=eth0 "${torchrun[@]}" --nnodes 1:2 --rdzv_endpoint "$DTRAIN_HOST_0:29700" \
      --rdzv_id recovery --rdzv_conf last_call_timeout=1 --max_restarts 1 --monitor_interval 0.2 --no_python \
      "$bin" --model mlp --global-batch 256 --epochs 2 --threads-per-worker 1 --report-every 1 --quiet \
      --workers 4 --storage-path "$work/recovery" --name lost >"$work/recovery-host$i.log" 2>&1 &
    agents[i]=$!
  done
  until compgen -G "$run/checkpoint_*/manifest.json" >/dev/null; do sleep 0.05; done
  sleep 2
  killed=$(date +%s.%N)
  echo "MEASURE killed_at $killed"
  for pid in $(ip netns pids "$DTRAIN_NETNS_1"); do kill -9 "$pid" 2>/dev/null || true; done
  wait "${agents[0]}" || { tail -n 30 "$work/recovery-host0.log"; exit 1; }
  wait "${agents[1]}" 2>/dev/null || true
  python3 - "$run" "$killed" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
killed = float(sys.argv[2])
after = [r for r in rows if r["timestamp"] > killed]
out = json.load(open(sys.argv[1] + "/outcome.json"))
print("MEASURE recovery_s", round(after[0]["timestamp"] - killed, 2), "(the restarted group's first step is step %d; "
      "outcome %s, restarts %d)" % (after[0]["step"], out["status"], out["restarts"]))
EOF
  exit 0
fi

rm -rf "$work"
mkdir -p "$work"
echo "MEASURE machine $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
DTRAIN_IN_HOSTS=1 "$root/scripts/netns-hosts" --hosts 2 -- "$self" "$bin" "$work" "$steps"
