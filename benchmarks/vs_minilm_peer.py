#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""examples/finetune_text_classifier against benchmarks/minilm_peer.py, side by side in one run: the
MiniLM tagger fine-tuned on 2 workers by dtrain and by PyTorch DDP over transformers.

    benchmarks/vs_minilm_peer.py --data DIR [--example build/examples/finetune_text_classifier]
                                 [--python .venv/bin/python] [--repeats 1] [--workers 2]
                                 [--global-batch 32] [--epochs 1] [--max-steps 0] [--max-len 128]
                                 [--lr 5e-5] [--warmup 0.1] [--seed 0] [--threads-per-worker 1]
                                 [--json FILE] [--allow-load]

DIR is scripts/make-text-corpus's output. The peer (run by the environment of scripts/python-env:
tests/tools/venv-python) and dtrain run alternately, `repeats` times each, with the same flags;
each figure is the median of its runs. Reported: training samples/s (the issue's target: dtrain
>= 1.2x the peer), holdout accuracy and macro F1 of each side's best checkpoint by val_loss, and
peak memory: the largest sum of the resident sets of the run's whole process tree (the driver and
its workers), sampled every 0.1 s from /proc, and the largest single process's VmHWM. The split
fingerprint, train rows, train tokens and steps must agree (a note says when they do not). Each
run records the other processes' share of the machine (benchmarks/idle.py): the script waits for
a quiet machine first, and exits 3 after printing when a run was loaded (--allow-load: marked).
"""
import argparse
import json
import os
import statistics
import sys

import idle
import timed_build
import process_tree

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.normpath(os.path.join(here, ".."))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--data", required=True, help="a directory holding dataset.csv and holdout.csv")
p.add_argument("--example", type=timed_build.program,
               default=os.path.join(root, "build", "examples", "finetune_text_classifier"))
p.add_argument("--python", default=os.path.join(root, "tests", "tools", "venv-python"),
               help="the Python that runs the peer (torch and transformers)")
p.add_argument("--peer", default=os.path.join(here, "minilm_peer.py"))
p.add_argument("--repeats", type=int, default=1)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--threads-per-worker", type=int, default=1)
p.add_argument("--global-batch", type=int, default=32)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--max-steps", type=int, default=0)
p.add_argument("--max-len", type=int, default=128)
p.add_argument("--lr", type=float, default=5e-5)
p.add_argument("--warmup", type=float, default=0.1)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--json", help="also write every run's JSON line and the picked figures to this file")
idle.add_argument(p)
args = p.parse_args()

for name in ("dataset.csv", "holdout.csv"):
    if not os.path.isfile(os.path.join(args.data, name)):
        sys.exit("vs_minilm_peer: %s has no %s; build a corpus with scripts/make-text-corpus %s" % (args.data, name, args.data))
if not os.path.isfile(args.example):
    sys.exit("vs_minilm_peer: --example %s does not exist; build it: cmake --build build --target "
             "finetune_text_classifier" % args.example)

env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads_per_worker), OMP_NUM_THREADS=str(args.threads_per_worker),
           HF_HUB_DISABLE_PROGRESS_BARS="1")
env.pop("FINETUNE_TEXT_CLASSIFIER_START", None)  # the example's start time is its own


def run(cmd):
    result = process_tree.measured(cmd, env, "vs_minilm_peer")
    loads.append(result["load"])
    return result


loads = []
flags = ["--data", args.data, "--workers", str(args.workers), "--threads-per-worker", str(args.threads_per_worker),
         "--global-batch", str(args.global_batch), "--epochs", str(args.epochs), "--max-steps", str(args.max_steps),
         "--max-len", str(args.max_len), "--lr", repr(args.lr), "--warmup", repr(args.warmup), "--seed", str(args.seed)]
ROWS = [("train_samples_per_s", "training samples/s", True), ("train_loop_s", "training loop s", False),
        ("startup_s", "startup s (start -> first step)", False), ("pipeline_s", "pipeline s (read, split, tokenise)", False),
        ("wall_s", "wall s", False), ("peak_rss_sum_mb", "peak RSS, all processes (MiB)", False),
        ("max_process_hwm_mb", "largest process's peak RSS (MiB)", False)]
QUALITY = ["val_loss", "val_accuracy", "test_accuracy", "test_f1_macro", "majority_baseline"]
SAME = ["split_fnv1a", "train_rows", "train_tokens", "test_rows", "classes", "steps", "train_samples", "total_steps",
        "warmup_steps"]

record = {"args": vars(args), "runs": {"peer": [], "dtrain": []}, "picked": {}}
idle.wait(args.allow_load)
peer, ours = record["runs"]["peer"], record["runs"]["dtrain"]
for i in range(args.repeats):
    peer.append(run([args.python, args.peer] + flags))
    ours.append(run([args.example] + flags + ["--storage-path", "/tmp/dtrain_minilm_bench",
                                              "--name", "bench_%d_%d" % (os.getpid(), i)]))
    print("run %d/%d: samples/s peer %.2f dtrain %.2f | test accuracy peer %.4f dtrain %.4f | peak MiB peer %.0f "
          "dtrain %.0f | others %.1f%% %.1f%%" % (i + 1, args.repeats, peer[-1]["train_samples_per_s"],
                                                ours[-1]["train_samples_per_s"], peer[-1]["test_accuracy"],
                                                ours[-1]["test_accuracy"], peer[-1]["peak_rss_sum_mb"],
                                                ours[-1]["peak_rss_sum_mb"], 100 * peer[-1]["load"]["others_share"],
                                                100 * ours[-1]["load"]["others_share"]), flush=True)
for key in SAME:
    if peer[0].get(key) != ours[0].get(key):
        print("  note: %s differs: peer %s, dtrain %s" % (key, peer[0].get(key), ours[0].get(key)))

print("\nMiniLM tagger, %d worker(s) x %d thread(s), global batch %d, %d step(s), median of %d run(s) each, interleaved"
      % (args.workers, args.threads_per_worker, args.global_batch, ours[0]["steps"], args.repeats))
print("| %-36s | %10s | %10s | %-22s |" % ("", "peer", "dtrain", "dtrain vs peer"))
print("| %s | %s | %s | %s |" % ("-" * 36, "-" * 10, "-" * 10, "-" * 22))
for key, label, higher in ROWS:
    a, b = statistics.median(r[key] for r in peer), statistics.median(r[key] for r in ours)
    ratio = (b / a if higher else a / b) if a and b else float("nan")
    record["picked"][key] = {"peer": a, "dtrain": b, "ratio": ratio}
    note = " (target >= 1.2x)" if key == "train_samples_per_s" else (" less" if "MiB" in label else " faster")
    print("| %-36s | %10.2f | %10.2f | x%-21s |" % (label, a, b, "%.2f%s" % (ratio, note)))
for key in QUALITY:
    a, b = statistics.median(r[key] for r in peer), statistics.median(r[key] for r in ours)
    record["picked"][key] = {"peer": a, "dtrain": b}
    print("| %-36s | %10.4f | %10.4f | %-22s |" % (key, a, b, ""))
print(flush=True)

record["load"] = idle.verdict(loads)
if args.json:
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
idle.refuse(record["load"], args.allow_load)
