#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""examples/dog_breeds against benchmarks/clip_peer.py, side by side in one run: Ray Train's dog-breed
workload (CLIP image features computed in the data pipeline, the tutorial's head trained on them on
N workers, the best by val_loss scoring the test split) by dtrain and by PyTorch DDP over
transformers' CLIPModel.

    benchmarks/vs_clip_peer.py [--data DIR] [--example build/examples/dog_breeds]
                               [--python tests/tools/venv-python] [--repeats 1] [--workers 2]
                               [--threads-per-worker 1] [--epochs 3] [--batch 64] [--lr 1e-3]
                               [--lr-factor 0.8] [--lr-patience 3] [--embed-batch 64]
                               [--loader-threads 2] [--concurrency 1] [--breeds 5] [--per-class 16]
                               [--seed 0] [--json FILE] [--allow-load]

--data: examples/make_dog_breeds.py's output (DIR/model, DIR/images); without it, the script makes
one with ViT-B/32's geometry (random weights: nothing downloaded), --breeds breeds and --per-class
files a split (train 4x). The peer (run by the environment of scripts/python-env) and dtrain run
alternately, `repeats` times each, with the same flags; each figure is the median of its runs.
Reported: end-to-end training samples/s (decode, processor and CLIP embeddings included: the loop's
time, validation not counted), the test accuracy of each side's best state by val_loss, and peak
memory of the run's whole process tree (benchmarks/process_tree.py). Each run records the other
processes' share of the machine (benchmarks/idle.py): the script waits for a quiet machine first,
and exits 3 after printing when a run was loaded (--allow-load: marked).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import idle
import timed_build
import process_tree

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.normpath(os.path.join(here, ".."))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--data", help="make_dog_breeds.py's output: DIR/model and DIR/images (default: made here)")
p.add_argument("--example", type=timed_build.program,
               default=os.path.join(root, "build", "examples", "dog_breeds"))
p.add_argument("--python", default=os.path.join(root, "tests", "tools", "venv-python"))
p.add_argument("--peer", default=os.path.join(here, "clip_peer.py"))
p.add_argument("--repeats", type=int, default=1)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--threads-per-worker", type=int, default=1)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--lr-factor", type=float, default=0.8)
p.add_argument("--lr-patience", type=int, default=3)
p.add_argument("--embed-batch", type=int, default=64)
p.add_argument("--loader-threads", type=int, default=2)
p.add_argument("--concurrency", type=int, default=1, help="dtrain's CLIP instances per worker (the peer has one)")
p.add_argument("--breeds", type=int, default=5)
p.add_argument("--per-class", type=int, default=16)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--json", help="also write every run's JSON line and the picked figures to this file")
idle.add_argument(p)
args = p.parse_args()

if not os.path.isfile(args.example):
    sys.exit("vs_clip_peer: --example %s does not exist; build it: cmake --build build --target dog_breeds" % args.example)
if args.repeats < 1:
    sys.exit("vs_clip_peer: --repeats must be at least 1")
env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads_per_worker), OMP_NUM_THREADS=str(args.threads_per_worker),
           HF_HUB_DISABLE_PROGRESS_BARS="1")
scratch = tempfile.mkdtemp(prefix="vs_clip_peer_")
if not args.data:
    args.data = os.path.join(scratch, "dogs")
    made = subprocess.run([args.python, os.path.join(root, "examples", "make_dog_breeds.py"), args.data, "--geometry",
                           "vit-b-32", "--breeds", str(args.breeds), "--per-class", str(args.per_class), "--seed",
                           str(args.seed)], env=env, capture_output=True, text=True)
    if made.returncode != 0:
        sys.exit("vs_clip_peer: examples/make_dog_breeds.py failed:\n" + made.stdout + made.stderr)
    print(made.stdout.strip())
for part in ("model", "images"):
    if not os.path.isdir(os.path.join(args.data, part)):
        sys.exit("vs_clip_peer: %s has no %s/; make one with examples/make_dog_breeds.py" % (args.data, part))

loads = []


def run(cmd):
    result = process_tree.measured(cmd, env, "vs_clip_peer")
    result.pop("per_breed", None)
    loads.append(result["load"])
    return result


flags = ["--model-dir", os.path.join(args.data, "model"), "--data", os.path.join(args.data, "images"), "--workers",
         str(args.workers), "--threads-per-worker", str(args.threads_per_worker), "--epochs", str(args.epochs),
         "--batch", str(args.batch), "--lr", repr(args.lr), "--lr-factor", repr(args.lr_factor), "--lr-patience",
         str(args.lr_patience), "--embed-batch", str(args.embed_batch), "--loader-threads", str(args.loader_threads),
         "--seed", str(args.seed)]
ROWS = [("train_samples_per_s", "samples/s end to end (embed + train)", True),
        ("loop_s", "training loops s (slowest rank)", False),
        ("wall_s", "wall s", False), ("peak_rss_sum_mb", "peak RSS, all processes (MiB)", False),
        ("max_process_hwm_mb", "largest process's peak RSS (MiB)", False)]
QUALITY = ["test_accuracy", "val_accuracy", "val_loss", "best_epoch"]
SAME = ["breeds", "train_images", "val_images", "test_images", "embedding_dim", "epochs", "batch"]

record = {"args": vars(args), "runs": {"peer": [], "dtrain": []}, "picked": {}}
idle.wait(args.allow_load)
peer, ours = record["runs"]["peer"], record["runs"]["dtrain"]
for i in range(args.repeats):
    peer.append(run([args.python, args.peer] + flags))
    ours.append(run([args.example] + flags + ["--concurrency", str(args.concurrency), "--storage-path",
                                              os.path.join(scratch, "runs"), "--name", "bench_%d" % i]))
    print("run %d/%d: samples/s peer %.2f dtrain %.2f | test accuracy peer %.4f dtrain %.4f | others %.1f%% %.1f%%"
          % (i + 1, args.repeats, peer[-1]["train_samples_per_s"], ours[-1]["train_samples_per_s"],
             peer[-1]["test_accuracy"], ours[-1]["test_accuracy"], 100 * peer[-1]["load"]["others_share"],
             100 * ours[-1]["load"]["others_share"]), flush=True)
for key in SAME:
    if peer[0].get(key) != ours[0].get(key):
        print("  note: %s differs: peer %s, dtrain %s" % (key, peer[0].get(key), ours[0].get(key)))

print("\nCLIP dog breeds, %d worker(s) x %d thread(s), batch %d, %d epoch(s), median of %d run(s) each, interleaved"
      % (args.workers, args.threads_per_worker, args.batch, args.epochs, args.repeats))
print("| %-38s | %10s | %10s | %-16s |" % ("", "peer", "dtrain", "dtrain vs peer"))
print("| %s | %s | %s | %s |" % ("-" * 38, "-" * 10, "-" * 10, "-" * 16))
for key, label, higher in ROWS:
    a, b = statistics.median(r[key] for r in peer), statistics.median(r[key] for r in ours)
    ratio = (b / a if higher else a / b) if a and b else float("nan")
    record["picked"][key] = {"peer": a, "dtrain": b, "ratio": ratio}
    note = "" if higher else (" less" if "MiB" in label else " faster")
    print("| %-38s | %10.2f | %10.2f | x%-15s |" % (label, a, b, "%.2f%s" % (ratio, note)))
for key in QUALITY:
    a, b = statistics.median(r[key] for r in peer), statistics.median(r[key] for r in ours)
    record["picked"][key] = {"peer": a, "dtrain": b}
    print("| %-38s | %10.4f | %10.4f | %-16s |" % (key, a, b, ""))
print(flush=True)

record["load"] = idle.verdict(loads)
if args.json:
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
idle.refuse(record["load"], args.allow_load)
