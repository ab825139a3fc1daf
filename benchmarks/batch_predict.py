#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Batch inference on N workers against one (issue 31): the Fashion-MNIST example's best checkpoint
scored over the 10,000 test images by evaluation::batch_predict.

    benchmarks/batch_predict.py [--example build/examples/fashion_mnist] [--model cnn]
                                [--workers 1,2] [--repeats 3] [--dir /tmp/dtrain_batch_predict]

Trains the example once (--max-steps 20: the weights do not change the work), then runs the same
command again `repeats` times for each worker count, alternating: the run is finished, so each
invocation only scores (--predictions, --predict-workers N). The time is the whole job as a user
sees it: workers started, rendezvous, every part scored and written, the parts joined. Prints
the medians, samples/s, and each count's speed-up over the first.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

import idle
import timed_build

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--example", type=timed_build.program,
               default=os.path.join(here, "..", "build", "examples", "fashion_mnist"))
p.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
p.add_argument("--workers", default="1,2", help="worker counts, comma-separated (the first is the baseline)")
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--dir", default="/tmp/dtrain_batch_predict")
idle.add_argument(p)
args = p.parse_args()
if not os.path.exists(args.example):
    sys.exit("batch_predict.py: %s does not exist; build it first (cmake --build build --target fashion_mnist)"
             % args.example)
counts = [int(w) for w in args.workers.split(",")]
if args.repeats < 1 or not counts or min(counts) < 1:
    sys.exit("batch_predict.py: --repeats and every worker count must be at least 1")

shutil.rmtree(args.dir, ignore_errors=True)
base = [args.example, "--model", args.model, "--workers", "1", "--max-steps", "20", "--quiet",
        "--storage-path", os.path.join(args.dir, "runs"), "--name", "bench"]


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("failed (exit %d): %s\n%s%s" % (out.returncode, " ".join(cmd), out.stdout, out.stderr))
    return json.loads(out.stdout.strip().splitlines()[-1])


run(base)  # the checkpoint
idle.wait(args.allow_load)
seconds = {n: [] for n in counts}
records = []
for _ in range(args.repeats):
    for n in counts:
        with idle.Run() as load:
            line = run(base + ["--predictions", os.path.join(args.dir, "predictions"), "--predict-workers", str(n)])
        records.append(load.record)
        assert line["predictions_samples"] == 10000, line
        seconds[n].append(line["predictions_s"])
print("fashion_mnist %s, 10000 test images, median of %d runs on %d cores" % (args.model, args.repeats, os.cpu_count()))
first = statistics.median(seconds[counts[0]])
for n in counts:
    s = statistics.median(seconds[n])
    print("%d worker(s): %.3f s, %.0f samples/s, x%.2f of %d worker(s)" % (n, s, 10000 / s, first / s, counts[0]))
idle.refuse(idle.verdict(records), args.allow_load)
