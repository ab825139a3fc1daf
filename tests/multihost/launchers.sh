#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# 2 hosts x 2 workers under a real launcher, on network namespaces made for the test
# (scripts/netns-hosts): the Fashion-MNIST example must reach the parameters of 4 workers on one
# host (dtrain's own driver) within 1e-5, and rank 0 must write the run directory as the driver does
# (the same files: params, history, checkpoints, outcome, report.html, the MLflow store), and its
# allreduces must have been hierarchical (shared memory inside a host, Gloo between the hosts'
# leaders; rank 0 says so on stderr) unless DTRAIN_HIERARCHICAL=0.
#
#   launchers.sh torchrun|torchrun_static|mpirun|slurm FASHION_MNIST_BINARY WORK_DIR
#
# torchrun: the c10d rendezvous (rank 0 hosts dtrain's store on the port torchrun picks);
# torchrun_static: --master_addr/--master_port with --node_rank (torchrun's agent hosts the store on
# MASTER_PORT and every worker connects to it as a client);
# slurm: Debian's slurm-wlm, a slurmctld on host 0 and a slurmd on each host (tests/multihost/slurm-node),
# no munge (auth/none), and `srun --nodes 2 --ntasks-per-node 2` from host 0.
#
# torchrun is that of $DTRAIN_TORCH_PYTHON (default Debian's /usr/bin/python3, torch 1.13): the
# Python whose torch is the LibTorch the example was built against, since the workers talk to the
# agent's store (LibTorch 2.x's TCPStore client and 1.13's server do not understand each other).
#
# Exits 77 (skipped) when network namespaces cannot be made, 1 with the reason on a failure.
set -euo pipefail
launcher=$1 bin=$(realpath "$2") work=$3
self=$(realpath "$0")
root=$(cd "$(dirname "$self")/../.." && pwd)
torch_python=${DTRAIN_TORCH_PYTHON:-/usr/bin/python3}
steps=${DTRAIN_MULTIHOST_STEPS:-12}
args=(--model mlp --global-batch 64 --max-steps "$steps" --seed 5 --quiet --keep-checkpoints 1 --record-every 2)
if [[ ${DTRAIN_IN_HOSTS:-} == 1 ]]; then
  # Inside the namespaces: the launcher on each host.
  case $launcher in
    torchrun)
      # One agent per host; host 0 hosts the c10d rendezvous at its address.
      for i in 0 1; do
        "$root/scripts/netns-hosts" on "$i" -- "$torch_python" -m torch.distributed.run \
          --nnodes 2 --nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint "$DTRAIN_HOST_0:29400" \
          --rdzv_id dtrain-test --redirects 2 --tee 2 --max_restarts 0 --no_python \
          "$bin" "${args[@]}" --workers 4 --storage-path "$work/launched" --name ref >"$work/host$i.log" 2>&1 &
        pids[i]=$!
      done
      status=0
      for i in 0 1; do wait "${pids[i]}" || status=$?; done
      exit $status
      ;;
    torchrun_static)
      for i in 0 1; do
        "$root/scripts/netns-hosts" on "$i" -- "$torch_python" -m torch.distributed.run \
          --nnodes 2 --nproc_per_node 2 --node_rank "$i" --master_addr "$DTRAIN_HOST_0" --master_port 29401 \
          --redirects 2 --tee 2 --max_restarts 0 --no_python \
          "$bin" "${args[@]}" --workers 4 --storage-path "$work/launched" --name ref >"$work/host$i.log" 2>&1 &
        pids[i]=$!
      done
      status=0
      for i in 0 1; do wait "${pids[i]}" || status=$?; done
      exit $status
      ;;
    mpirun)
      # Open MPI reaches host 1 through its "rsh agent": a script that enters that host's
      # namespaces where it would run ssh (tests/multihost/netns-rsh).
      printf '%s slots=2\n%s slots=2\n' dtrain-host0 dtrain-host1 >"$work/hostfile"
      exec "$root/scripts/netns-hosts" on 0 -- mpirun --allow-run-as-root -np 4 --hostfile "$work/hostfile" \
        --mca plm_rsh_agent "$root/tests/multihost/netns-rsh" --mca btl self,tcp \
        --mca btl_tcp_if_include 192.0.2.0/24 --mca oob_tcp_if_include 192.0.2.0/24 \
        -x MASTER_ADDR=dtrain-host0 -x MASTER_PORT=29511 ${DTRAIN_HIERARCHICAL:+-x DTRAIN_HIERARCHICAL} \
        "$bin" "${args[@]}" --workers 4 --storage-path "$work/launched" --name ref >"$work/mpirun.log" 2>&1
      ;;
    slurm)
      export SLURM_CONF=$work/slurm/slurm.conf
      mkdir -p "$work/slurm/state" "$work/slurm/spool-dtrain-host0" "$work/slurm/spool-dtrain-host1"
      sed "s|@DIR@|$work/slurm|g" "$root/tests/multihost/slurm.conf.in" >"$SLURM_CONF"
      "$root/scripts/netns-hosts" on 0 -- slurmctld -D -f "$SLURM_CONF" >"$work/slurm/slurmctld.out" 2>&1 &
      daemons=($!)
      for i in 0 1; do
        "$root/scripts/netns-hosts" on "$i" -- "$root/tests/multihost/slurm-node" "dtrain-host$i" \
          >"$work/slurm/slurmd-$i.out" 2>&1 &
        daemons+=($!)
      done
      # SIGKILL: the daemons' state is the test's to throw away, and a slurmd ending its job steps
      # must not keep this script waiting (netns-hosts kills what they left inside the hosts).
      trap 'kill -9 "${daemons[@]}" 2>/dev/null; wait' EXIT
      # Both nodes idle: the daemons registered. Every step has a deadline, so that a cluster that
      # does not come up fails with its logs instead of running into CTest's timeout.
      deadline=$((SECONDS + 90))
      until [[ $("$root/scripts/netns-hosts" on 0 -- timeout 10 sinfo -h -o %t 2>/dev/null) == idle ]]; do
        if ((SECONDS > deadline)); then
          echo "launchers.sh: the Slurm nodes were not both idle within 90 s:" >&2
          "$root/scripts/netns-hosts" on 0 -- timeout 10 sinfo -N -l >&2 || true
          exit 1
        fi
        sleep 0.2
      done
      # A task that fails ends the step (--kill-on-bad-exit), and the others are ended 60 s after
      # the first task ends (--wait; Slurm's default waits for ever). srun forwards a SIGTERM to
      # the tasks and waits for them: SIGKILL 15 s later.
      status=0
      "$root/scripts/netns-hosts" on 0 -- timeout -k 15 240 srun --nodes 2 --ntasks-per-node 2 \
        --kill-on-bad-exit=1 --wait=60 \
        --export=ALL,MASTER_ADDR=dtrain-host0,MASTER_PORT=29512 \
        "$bin" "${args[@]}" --workers 4 --storage-path "$work/launched" --name ref >"$work/srun.log" 2>&1 ||
        status=$?
      ((status == 124 || status == 137)) && echo "launchers.sh: srun did not finish within 240 s" >&2
      exit $status
      ;;
    *) echo "launchers.sh: the launcher must be torchrun or mpirun, not $launcher" >&2; exit 2 ;;
  esac
fi

rm -rf "$work"
mkdir -p "$work"
cd "$work"
# The reference: 4 workers on one host, dtrain's own driver. The hierarchical allreduce adds up in
# rank order as the one-host shared-memory channel does; with DTRAIN_HIERARCHICAL=0 every collective
# across hosts is Gloo's, and so are the reference's (the two orders differ in the last bits, which
# Adam turns into differences far above 1e-5).
reference_shm=1
[[ ${DTRAIN_HIERARCHICAL:-1} == 0 ]] && reference_shm=0
DTRAIN_SHARED_MEMORY=$reference_shm timeout -k 10 240 "$bin" "${args[@]}" --workers 4 --storage-path "$work/one_host" --name ref >"$work/one_host.log" 2>&1 ||
  { cat "$work/one_host.log"; echo "launchers.sh: the one-host reference run failed" >&2; exit 1; }

# A deadline under CTest's 600 s, so that a launcher that hangs fails with its logs below; netns-hosts
# takes SIGTERM by killing what runs inside its hosts and removing them.
set +e
DTRAIN_IN_HOSTS=1 timeout -k 20 420 "$root/scripts/netns-hosts" --hosts 2 -- "$self" "$launcher" "$bin" "$work"
status=$?
set -e
[[ $status == 77 ]] && exit 77
if [[ $status != 0 ]]; then
  tail -n 30 "$work"/host*.log "$work"/mpirun.log "$work"/srun.log "$work"/slurm/*.out "$work"/slurm/*.log 2>/dev/null || true
  [[ $status == 124 || $status == 137 ]] && echo "launchers.sh: the $launcher run did not end within 420 s" >&2
  echo "launchers.sh: the $launcher run across 2 hosts failed (status $status)" >&2
  exit 1
fi

# The allreduces across hosts took the hierarchical path (rank 0's line on stderr), or not when off.
used=$(cat "$work"/host*.log "$work"/mpirun.log "$work"/srun.log 2>/dev/null |
  grep -c "dtrain: hierarchical allreduce over 2 hosts (ranks 0-1, 2-3)" || true)
if [[ $reference_shm == 1 && $used != 1 ]]; then
  echo "launchers.sh: rank 0 did not report the hierarchical allreduce over 2 hosts ($used lines)" >&2
  exit 1
elif [[ $reference_shm == 0 && $used != 0 ]]; then
  echo "launchers.sh: DTRAIN_HIERARCHICAL=0, yet the allreduce was hierarchical" >&2
  exit 1
fi
echo "hierarchical allreduce: $([[ $used == 1 ]] && echo used || echo off)"

# Both runs' final checkpoints, compared tensor by tensor (Python reads model.pt with weights_only).
/usr/bin/python3 - "$work/one_host/ref" "$work/launched/ref" <<'EOF'
import glob, sys, torch
def final(run):
    cks = sorted(glob.glob(run + "/checkpoint_*/model.pt"))
    if not cks:
        sys.exit(f"launchers.sh: no checkpoint in {run}: rank 0 did not write the run directory")
    return torch.load(cks[-1], weights_only=True), cks[-1]
(a, pa), (b, pb) = final(sys.argv[1]), final(sys.argv[2])
if a.keys() != b.keys():
    sys.exit(f"launchers.sh: {pa} and {pb} hold different tensors")
worst = 0.0
for k in a:
    worst = max(worst, ((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)).item())
print(f"max relative difference {worst:.3g} over {len(a)} tensors ({pa} vs {pb})")
sys.exit(0 if worst <= 1e-5 else 1)
EOF

# Rank 0 under the launcher records the run as dtrain's driver does: the same files, each parsed.
/usr/bin/python3 - "$work/one_host" "$work/launched" <<'EOF'
import json, os, re, sys, yaml
def files(storage):  # relative paths, with the run's own ids and checkpoint numbers made neutral
    out = set()
    for root, _, names in os.walk(storage):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), storage)
            rel = re.sub(r"checkpoint_\d+", "checkpoint_N", rel)
            rel = re.sub(r"mlruns/\d+/[0-9a-f]{32}", "mlruns/EXPERIMENT/RUN", rel)
            out.add(re.sub(r"mlruns/\d+/", "mlruns/EXPERIMENT/", rel))
    return out
one, launched = files(sys.argv[1]), files(sys.argv[2])
if one != launched:
    sys.exit(f"launchers.sh: the launched run's files differ from the driver's: only one host: "
             f"{sorted(one - launched)}, only launched: {sorted(launched - one)}")
run = os.path.join(sys.argv[2], "ref")
load = lambda f: json.load(open(os.path.join(run, f)))
params, outcome, index = load("params.json"), load("outcome.json"), load("checkpoints.json")
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
problems = []
if params["scaling"]["num_workers"] != 4:
    problems.append("params.json: num_workers %s" % params["scaling"]["num_workers"])
if outcome["status"] != "finished" or outcome["error"] is not None:
    problems.append("outcome.json: %s" % outcome)
if outcome["reports"] != len(rows) or not rows:
    problems.append("outcome.json counts %s reports, metrics.jsonl has %d" % (outcome["reports"], len(rows)))
if index["latest"] is None or not os.path.isdir(os.path.join(run, index["latest"])):
    problems.append("checkpoints.json: latest %s" % index["latest"])
if 'data-metric="loss"' not in open(os.path.join(run, "report.html")).read():
    problems.append("report.html draws no loss curve from rank 0's steps.jsonl")
metas = [os.path.join(r, "meta.yaml") for r, dirs, _ in os.walk(os.path.join(sys.argv[2], "mlruns")) if "artifacts" in dirs]
if len(metas) != 1 or yaml.safe_load(open(metas[0]))["status"] != 3:
    problems.append("MLflow store: runs %s, not one FINISHED (3)" % metas)
if problems:
    sys.exit("launchers.sh: the launched run directory: " + "; ".join(problems))
print(f"the launched run directory holds the driver's {len(launched)} files; outcome finished, {len(rows)} reports")
EOF
