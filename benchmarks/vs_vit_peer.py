#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""examples/finetune_vit against benchmarks/vit_peer.py, side by side in one run: a ViT fine-tuned on
an image folder on 2 workers, with an evaluation every N steps, by dtrain and by PyTorch DDP over
transformers' ViTForImageClassification.

    benchmarks/vs_vit_peer.py --data ROOT [--model-dir DIR] [--example build/examples/finetune_vit]
                              [--python tests/tools/venv-python] [--repeats 1] [--workers 2]
                              [--threads-per-worker 1] [--global-batch 32] [--epochs 1] [--max-steps 0]
                              [--eval-every 50] [--val-fraction 0.1] [--lr 2e-4] [--weight-decay 0.01]
                              [--warmup 0.1] [--seed 0] [--json FILE] [--allow-load]

ROOT is scripts/make-image-folder's output. --model-dir is a ViTForImageClassification directory;
without it, examples/make_vit.py makes its default (random weights, image 32, patch 8, hidden 128,
4 layers) in a temporary directory, and both sides start from it. The peer (run by the environment of
scripts/python-env) and dtrain run alternately, `repeats` times each, with the same flags; each figure
is the median of its runs. Reported: training samples/s (evaluations not counted), the test accuracy
of each side's best checkpoint by val_loss, the best and final validation figures, and peak memory:
the largest sum of the resident sets of the run's whole process tree (the driver and its workers),
sampled every 0.1 s from /proc, and the largest single process's VmHWM. The split fingerprint, image
counts, steps and evaluations must agree (a note says when they do not). Each run records the other
processes' share of the machine (benchmarks/idle.py): the script waits for a quiet machine first, and
exits 3 after printing when a run was loaded (--allow-load: marked).
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
p.add_argument("--data", required=True, help="an image folder with train/ and test/ (scripts/make-image-folder)")
p.add_argument("--model-dir", help="a ViTForImageClassification directory (default: examples/make_vit.py's)")
p.add_argument("--example", type=timed_build.program,
               default=os.path.join(root, "build", "examples", "finetune_vit"))
p.add_argument("--python", default=os.path.join(root, "tests", "tools", "venv-python"),
               help="the Python that runs the peer (torch, torchvision, transformers)")
p.add_argument("--peer", default=os.path.join(here, "vit_peer.py"))
p.add_argument("--repeats", type=int, default=1)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--threads-per-worker", type=int, default=1)
p.add_argument("--global-batch", type=int, default=32)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--max-steps", type=int, default=0)
p.add_argument("--eval-every", type=int, default=50)
p.add_argument("--val-fraction", type=float, default=0.1)
p.add_argument("--lr", type=float, default=2e-4)
p.add_argument("--weight-decay", type=float, default=0.01)
p.add_argument("--warmup", type=float, default=0.1)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--json", help="also write every run's JSON line and the picked figures to this file")
idle.add_argument(p)
args = p.parse_args()

for name in ("train", "test"):
    if not os.path.isdir(os.path.join(args.data, name)):
        sys.exit("vs_vit_peer: %s has no %s/; make an image folder with scripts/make-image-folder %s --per-class 500"
                 % (args.data, name, args.data))
if not os.path.isfile(args.example):
    sys.exit("vs_vit_peer: --example %s does not exist; build it: cmake --build build --target finetune_vit"
             % args.example)
if args.repeats < 1:
    sys.exit("vs_vit_peer: --repeats must be at least 1")

env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads_per_worker), OMP_NUM_THREADS=str(args.threads_per_worker),
           HF_HUB_DISABLE_PROGRESS_BARS="1")
env.pop("FINETUNE_VIT_START", None)  # the example's start time is its own
scratch = tempfile.mkdtemp(prefix="vs_vit_peer_")
if not args.model_dir:
    args.model_dir = os.path.join(scratch, "vit")
    made = subprocess.run([args.python, os.path.join(root, "examples", "make_vit.py"), args.model_dir], env=env,
                          capture_output=True, text=True)
    if made.returncode != 0:
        sys.exit("vs_vit_peer: examples/make_vit.py failed:\n" + made.stdout + made.stderr)
    print(made.stdout.strip())


def run(cmd):
    result = process_tree.measured(cmd, env, "vs_vit_peer")
    result.pop("probe_logits", None)
    loads.append(result["load"])
    return result


loads = []
flags = ["--model-dir", args.model_dir, "--data", args.data, "--workers", str(args.workers),
         "--threads-per-worker", str(args.threads_per_worker), "--global-batch", str(args.global_batch),
         "--epochs", str(args.epochs), "--max-steps", str(args.max_steps), "--eval-every", str(args.eval_every),
         "--val-fraction", repr(args.val_fraction), "--lr", repr(args.lr), "--weight-decay", repr(args.weight_decay),
         "--warmup", repr(args.warmup), "--seed", str(args.seed)]
ROWS = [("train_samples_per_s", "training samples/s", True), ("train_s", "training s (evaluations not counted)", False),
        ("eval_s", "evaluations s", False), ("startup_s", "startup s (start -> first step)", False),
        ("pipeline_s", "pipeline s (decode, process, split)", False), ("wall_s", "wall s", False),
        ("peak_rss_sum_mb", "peak RSS, all processes (MiB)", False),
        ("max_process_hwm_mb", "largest process's peak RSS (MiB)", False)]
QUALITY = ["test_accuracy", "val_accuracy", "val_loss", "best_step", "final_val_accuracy", "final_val_loss",
           "final_train_loss"]
SAME = ["split_fnv1a", "train_images", "val_images", "test_images", "classes", "steps", "total_steps", "warmup_steps",
        "evals", "train_samples", "image_size"]

record = {"args": vars(args), "runs": {"peer": [], "dtrain": []}, "picked": {}}
idle.wait(args.allow_load)
peer, ours = record["runs"]["peer"], record["runs"]["dtrain"]
for i in range(args.repeats):
    peer.append(run([args.python, args.peer] + flags))
    ours.append(run([args.example] + flags + ["--storage-path", os.path.join(scratch, "runs"),
                                              "--name", "bench_%d" % i]))
    print("run %d/%d: samples/s peer %.2f dtrain %.2f | test accuracy peer %.4f dtrain %.4f | peak MiB peer %.0f "
          "dtrain %.0f | others %.1f%% %.1f%%" % (i + 1, args.repeats, peer[-1]["train_samples_per_s"],
                                                ours[-1]["train_samples_per_s"], peer[-1]["test_accuracy"],
                                                ours[-1]["test_accuracy"], peer[-1]["peak_rss_sum_mb"],
                                                ours[-1]["peak_rss_sum_mb"], 100 * peer[-1]["load"]["others_share"],
                                                100 * ours[-1]["load"]["others_share"]), flush=True)
for key in SAME:
    if peer[0].get(key) != ours[0].get(key):
        print("  note: %s differs: peer %s, dtrain %s" % (key, peer[0].get(key), ours[0].get(key)))

print("\nViT, %d worker(s) x %d thread(s), global batch %d, %d step(s), evaluation every %d, median of %d run(s) each, "
      "interleaved" % (args.workers, args.threads_per_worker, args.global_batch, ours[0]["steps"], args.eval_every,
                       args.repeats))
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
