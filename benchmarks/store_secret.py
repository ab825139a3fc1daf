#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""What the run secret costs (issue 33): the same 2-process run with and without it, side by side.

    benchmarks/store_secret.py [--example build/examples/fashion_mnist] [--steps 300] [--repeats 3]

Starts the Fashion-MNIST example's 2 ranks as a launcher does (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT: rank 0 hosts dtrain's store), alternately with DTRAIN_RUN_SECRET set (every
connection proves it: HMAC-SHA256 of the server's nonce) and without (the store admits any client),
`repeats` times each. Per run: the time from starting the processes to the first training step
(LibTorch's load, the store, rendezvous, Gloo's connections: the part the secret could touch), and
the training samples/s after it (the secret is not used per step). Prints the medians and the ratios.
"""
import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import time

import idle
import timed_build

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--example", type=timed_build.program,
               default=os.path.join(here, "..", "build", "examples", "fashion_mnist"))
p.add_argument("--steps", type=int, default=300)
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--dir", default="/tmp/dtrain_store_secret")
idle.add_argument(p)
args = p.parse_args()
if not os.path.exists(args.example):
    sys.exit("store_secret.py: %s does not exist; build it first (cmake --build build --target fashion_mnist)"
             % args.example)
if args.repeats < 1 or args.steps < 1:
    sys.exit("store_secret.py: --repeats and --steps must be at least 1")
shutil.rmtree(args.dir, ignore_errors=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(name, secret):
    port = free_port()
    cmd = [args.example, "--model", "mlp", "--workers", "2", "--max-steps", str(args.steps), "--quiet",
           "--storage-path", args.dir, "--name", name]
    procs = []
    start = time.time()
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        env.pop("DTRAIN_RUN_SECRET", None)
        env.pop("DTRAIN_RUN_SECRET_FILE", None)
        if secret:
            env["DTRAIN_RUN_SECRET"] = secret
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            sys.exit("failed (exit %d): %s\n%s%s" % (proc.returncode, " ".join(cmd), out, err))
    rows = [json.loads(l) for l in open(os.path.join(args.dir, name, "metrics.jsonl")) if l.strip()]
    last = rows[-1]
    return {"to_first_step_s": last["first_step_unix"] - start, "samples_per_s": last["train_samples_per_s"]}


figures = {"with": [], "without": []}
records = []
idle.wait(args.allow_load)
for i in range(args.repeats):
    for mode in ("with", "without"):
        with idle.Run() as load:
            figures[mode].append(run("%s_%d" % (mode, i), secrets.token_hex(32) if mode == "with" else None))
        records.append(load.record)


def med(mode, key):
    return statistics.median(r[key] for r in figures[mode])


print("fashion_mnist mlp, 2 ranks started as a launcher does, %d steps, median of %d runs on %d cores"
      % (args.steps, args.repeats, os.cpu_count()))
for mode in ("with", "without"):
    print("%-7s secret: start to first step %.3f s, %.0f samples/s" % (mode, med(mode, "to_first_step_s"),
                                                                       med(mode, "samples_per_s")))
print("with / without: start to first step x%.3f, samples/s x%.3f"
      % (med("with", "to_first_step_s") / med("without", "to_first_step_s"),
         med("with", "samples_per_s") / med("without", "samples_per_s")))
idle.refuse(idle.verdict(records), args.allow_load)
