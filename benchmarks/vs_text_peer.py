#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""examples/text_classifier against the Python peer benchmarks/peers/text.py, side by side in one run.

    benchmarks/vs_text_peer.py --data DIR [--example build/examples/text_classifier]
                               [--peer benchmarks/peers/text.py] [--python tests/tools/venv-python]
                               [--peer-mode eager|compile|both] [--models transformer,bag]
                               [--repeats 3] [--pick median|best] [--workers 2] [--global-batch 64]
                               [--epochs 1] [--max-steps 0] [--max-len 128] [--vocab 20000] [--seed 0]
                               [--threads-per-worker 1] [--loader-threads 2] [--json FILE] [--allow-load]

DIR is scripts/make-text-corpus's output (dataset.csv, holdout.csv). For each model the peer and
dtrain run alternately, `repeats` times each, with the same flags, so a machine loaded by other
work slows both alike. Each figure is the median (or, --pick best, the best: highest throughput,
lowest times) of its runs; the table gives the ratios the issue sets targets for: training
samples/s dtrain / peer (>= 1.5) and pipeline speed peer_s / dtrain_s (>= 3). Accuracy and F1 are
printed beside the majority-class baseline of holdout.csv; the two must agree closely, since both
do the same work (same split, vocabulary, model and optimiser) from different random initialisations.
The peer runs with --python (the environment of scripts/python-env, torch 2.x) in eager mode, under
torch.compile (its compilation counts in its loop), or both (--peer-mode both: the "peer" column is
the faster mode, by the picked training throughput; the table's heading gives each mode's).
Each run records the other processes' share of the machine (benchmarks/idle.py): the script waits
for a quiet machine first, and exits 3 after printing when a run was loaded (--allow-load: marked).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import idle
import timed_build

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--data", required=True, help="a directory holding dataset.csv and holdout.csv")
p.add_argument("--example", type=timed_build.program,
               default=os.path.join(here, "..", "build", "examples", "text_classifier"))
p.add_argument("--peer", default=os.path.join(here, "peers", "text.py"),
               help="the Python peer (default benchmarks/peers/text.py)")
p.add_argument("--python", default=os.path.join(here, "..", "tests", "tools", "venv-python"),
               help="the Python that runs the peer (default tests/tools/venv-python: scripts/python-env's)")
p.add_argument("--peer-mode", choices=["eager", "compile", "both"], default="eager",
               help="run the peer in eager mode, under torch.compile (--compile), or both")
p.add_argument("--models", default="transformer,bag")
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--pick", choices=["median", "best"], default="median")
p.add_argument("--workers", type=int, default=2)
p.add_argument("--threads-per-worker", type=int, default=1)
p.add_argument("--global-batch", type=int, default=64)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--max-steps", type=int, default=0)
p.add_argument("--max-len", type=int, default=128)
p.add_argument("--vocab", type=int, default=20000)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--loader-threads", type=int, default=2, help="dtrain's own flag: its loader threads per worker")
p.add_argument("--json", help="also write every run's JSON line and the picked figures to this file")
idle.add_argument(p)
args = p.parse_args()

for name in ("dataset.csv", "holdout.csv"):
    if not os.path.isfile(os.path.join(args.data, name)):
        sys.exit("vs_text_peer: %s has no %s; build a corpus with scripts/make-text-corpus %s"
                 % (args.data, name, args.data))
if not os.path.isfile(args.example):
    sys.exit("vs_text_peer: --example %s does not exist; build it: cmake --build build --target text_classifier"
             % args.example)
if not os.path.isfile(args.peer):
    sys.exit("vs_text_peer: --peer %s does not exist" % args.peer)
if not os.access(args.python, os.X_OK):
    sys.exit("vs_text_peer: --python %s is not a program (scripts/python-env makes the default)" % args.python)

env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads_per_worker), OMP_NUM_THREADS=str(args.threads_per_worker))
env.pop("TEXT_CLASSIFIER_START", None)  # the example's start time is its own, not an inherited one


def run(cmd):
    with idle.Run() as load:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if out.returncode != 0:
        sys.exit("vs_text_peer: failed: %s\n%s%s" % (" ".join(cmd), out.stdout, out.stderr[-4000:]))
    lines = [l for l in out.stdout.strip().splitlines() if l.startswith("{")]
    if not lines:
        sys.exit("vs_text_peer: no JSON line from %s\n%s" % (" ".join(cmd), out.stdout))
    result = json.loads(lines[-1])
    result["load"] = load.record
    loads.append(load.record)
    return result


loads = []
common = ["--data", args.data, "--workers", str(args.workers), "--threads-per-worker", str(args.threads_per_worker),
          "--global-batch", str(args.global_batch), "--epochs", str(args.epochs), "--max-steps", str(args.max_steps),
          "--max-len", str(args.max_len), "--vocab", str(args.vocab), "--seed", str(args.seed)]
names = iter(range(1_000_000))

# (key, label, higher is better, how the ratio reads)
SPEED = [("pipeline_s", "pipeline_s (read, split, vocab, tokenise)", False),
         ("train_samples_per_s", "train_samples_per_s (collate included)", True),
         ("startup_s", "startup_s (start -> first step)", False),
         ("wall_s", "wall_s", False)]
QUALITY = [("val_accuracy", "val_accuracy"), ("test_accuracy", "test_accuracy"), ("test_f1_macro", "test_f1_macro"),
           ("majority_baseline", "majority_baseline (holdout)")]
SAME = ["train_rows", "vocab_size", "classes", "steps", "train_samples"]


def pick(runs, key, higher_better):
    values = [r[key] for r in runs]
    if args.pick == "median":
        return statistics.median(values)
    return max(values) if higher_better else min(values)


record = {"args": vars(args), "runs": {}, "picked": {}}
idle.wait(args.allow_load)
for model in args.models.split(","):
    flags = ["--model", model] + common
    modes = ["eager", "compile"] if args.peer_mode == "both" else [args.peer_mode]
    peers, ours = {mode: [] for mode in modes}, []
    for i in range(args.repeats):
        for mode in modes:
            peers[mode].append(run([args.python, args.peer] + flags + (["--compile"] if mode == "compile" else [])))
        peer = peers[modes[-1]]
        # A run directory of its own per run: an existing one would be resumed, not trained again.
        ours.append(run([args.example] + flags + ["--loader-threads", str(args.loader_threads),
                                                  "--storage-path", "/tmp/dtrain_text_bench",
                                                  "--name", "bench_%d_%d" % (os.getpid(), next(names))]))
        print("%s run %d/%d: samples/s peer %.1f dtrain %.1f | pipeline_s peer %.3f dtrain %.3f | others %.1f%% %.1f%%"
              % (model, i + 1, args.repeats, peer[-1]["train_samples_per_s"], ours[-1]["train_samples_per_s"],
                 peer[-1]["pipeline_s"], ours[-1]["pipeline_s"], 100 * peer[-1]["load"]["others_share"],
                 100 * ours[-1]["load"]["others_share"]), flush=True)
    by_mode = {mode: pick(rs, "train_samples_per_s", True) for mode, rs in peers.items()}
    fastest = max(by_mode, key=by_mode.get)
    peer = peers[fastest]
    for key in SAME:
        if peer[0].get(key) != ours[0].get(key):
            print("  note: %s differs: peer %s, dtrain %s" % (key, peer[0].get(key), ours[0].get(key)))
    record["runs"][model] = {"peer": peer, "dtrain": ours, "peer_by_mode": peers}
    picked = record["picked"][model] = {"peer_mode": fastest}
    print("\n%s model, %d worker(s) x %d thread(s), global batch %d, %s of %d run(s) each, interleaved; peer: %s"
          % (model, args.workers, args.threads_per_worker, args.global_batch, args.pick, args.repeats,
             ", ".join("%s %.1f samples/s" % kv for kv in by_mode.items()) if len(by_mode) > 1 else fastest))
    print("| %-44s | %10s | %10s | %-26s |" % ("", "peer", "dtrain", "dtrain vs peer"))
    print("| %s | %s | %s | %s |" % ("-" * 44, "-" * 10, "-" * 10, "-" * 26))
    for key, label, higher in SPEED:
        a, b = pick(peer, key, higher), pick(ours, key, higher)
        ratio = (b / a) if higher else (a / b)
        picked[key] = {"peer": a, "dtrain": b, "ratio": ratio}
        target = {"train_samples_per_s": " (target >= 1.5x)", "pipeline_s": " faster (target >= 3x)"}.get(key, " faster")
        print("| %-44s | %10.3f | %10.3f | x%-25s |" % (label, a, b, "%.2f%s" % (ratio, target)))
    for key, label in QUALITY:
        a, b = pick(peer, key, True), pick(ours, key, True)
        picked[key] = {"peer": a, "dtrain": b}
        print("| %-44s | %10.4f | %10.4f | %-26s |" % (label, a, b, ""))
    print("| %-44s | %10s | %10s | %-26s |" % ("train rows / vocabulary", "%d / %d" % (peer[0]["train_rows"], peer[0]["vocab_size"]),
                                              "%d / %d" % (ours[0]["train_rows"], ours[0]["vocab_size"]), ""))
    print(flush=True)

record["load"] = idle.verdict(loads)
if args.json:
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
idle.refuse(record["load"], args.allow_load)
