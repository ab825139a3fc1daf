#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""dtrain's example against the PyTorch DDP peer, side by side in one run, reported as ratios.

    benchmarks/vs_peer.py [--example build/examples/fashion_mnist] [--peer ../shared/peers/torch_ddp_peer.py]
                          [--baseline OTHER_BUILD/examples/fashion_mnist]
                          [--steps 300] [--repeats 2] [--models cnn,mlp] [--workers 1,2]

Each configuration (model x workers, global batch 128, --max-steps steps, one thread and one BLAS
thread per worker) runs the peer and dtrain alternately, `repeats` times each; the table gives the
median of each and the ratios the issues set targets for.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--example", default=os.path.join(here, "..", "build", "examples", "fashion_mnist"))
p.add_argument("--peer", default=os.path.join(here, "..", "..", "shared", "peers", "torch_ddp_peer.py"))
p.add_argument("--steps", type=int, default=300)
p.add_argument("--repeats", type=int, default=2)
p.add_argument("--models", default="cnn,mlp")
p.add_argument("--workers", default="1,2")
p.add_argument("--baseline", help="another build of the example (e.g. the previous main's), run alternately "
                                  "with --example: its throughput ratio shows a regression beside the noise")
args = p.parse_args()

env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")


def run(cmd):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if out.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    return json.loads(out.stdout.strip().splitlines()[-1])


common = ["--global-batch", "128", "--max-steps", str(args.steps), "--threads-per-worker", "1"]
rows = {}
names = iter(range(1_000_000))


def dtrain_run(example, flags):
    # A name of its own per run: a run directory that exists would be resumed, not trained again.
    return run([example] + flags + ["--storage-path", "/tmp/dtrain_bench", "--name", "bench_%d_%d" % (os.getpid(), next(names))])

for model in args.models.split(","):
    for workers in [int(w) for w in args.workers.split(",")]:
        flags = ["--model", model, "--workers", str(workers)] + common
        peer, ours, base = [], [], []
        for _ in range(args.repeats):
            peer.append(run(["/usr/bin/python3", args.peer] + flags))
            ours.append(dtrain_run(args.example, flags))
            if args.baseline:
                base.append(dtrain_run(args.baseline, flags))
        med = lambda runs, key: statistics.median(r[key] for r in runs)
        if base:
            print("%-4s %d worker(s): samples/s dtrain %8.0f baseline %8.0f (x%.3f) | startup_s dtrain %.2f baseline %.2f"
                  % (model, workers, med(ours, "train_samples_per_s"), med(base, "train_samples_per_s"),
                     med(ours, "train_samples_per_s") / med(base, "train_samples_per_s"),
                     med(ours, "startup_s"), med(base, "startup_s")), flush=True)
        rows[(model, workers)] = {k: (med(peer, k), med(ours, k)) for k in ("train_samples_per_s", "startup_s", "wall_s")}
        r = rows[(model, workers)]
        print("%-4s %d worker(s): samples/s peer %8.0f dtrain %8.0f (x%.2f) | startup_s peer %.2f dtrain %.2f | "
              "wall_s peer %.2f dtrain %.2f" % (model, workers, *r["train_samples_per_s"],
                                               r["train_samples_per_s"][1] / r["train_samples_per_s"][0],
                                               *r["startup_s"], *r["wall_s"]), flush=True)

print()
for model in args.models.split(","):
    if (model, 1) in rows and (model, 2) in rows:
        one, two = rows[(model, 1)]["train_samples_per_s"], rows[(model, 2)]["train_samples_per_s"]
        print("%-4s scaling 1 -> 2 workers: peer x%.2f, dtrain x%.2f" % (model, two[0] / one[0], two[1] / one[1]))
