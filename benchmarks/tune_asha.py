#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""What ASHA saves on the text tagger (issue 34): the same search run to the end (FIFO) and with
ASHA, and the default configuration beside them, on one corpus.

    benchmarks/tune_asha.py [--build build] [--data DIR] [--samples 8] [--epochs 8] [--concurrent 2]
                            [--dir /tmp/dtrain_tune_asha] [--allow-load]

- default: examples/text_classifier with text_classifier's settings (bag model, lr 1e-3, no dropout
  before the head, 1 worker, global batch 64, seed 0) for --epochs; its lowest val_loss;
- fifo / asha: examples/tune_text_classifier, --samples trials over lr (log-uniform 1e-4..1e-2) and
  dropout (uniform 0..0.5), seed 0, 1 worker each, --concurrent at once, for --epochs; ASHA with
  max_t = epochs, grace period 1, reduction factor 2. The same trials (the same seed) either way.
Prints each side's best val_loss, the epochs its trials trained, its wall time, and what ASHA saved.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import idle

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--build", default=os.path.join(here, "..", "build"))
p.add_argument("--data", help="a corpus (scripts/make-text-corpus DIR); default: made in --dir")
p.add_argument("--samples", type=int, default=8)
p.add_argument("--epochs", type=int, default=8)
p.add_argument("--concurrent", type=int, default=2)
p.add_argument("--dir", default="/tmp/dtrain_tune_asha")
idle.add_argument(p)
args = p.parse_args()
examples = os.path.join(args.build, "examples")
for exe in ("text_classifier", "tune_text_classifier"):
    if not os.path.exists(os.path.join(examples, exe)):
        sys.exit("tune_asha.py: %s/%s does not exist; build it first (cmake --build build --target %s)" % (examples, exe, exe))
shutil.rmtree(os.path.join(args.dir, "runs"), ignore_errors=True)
data = args.data or os.path.join(args.dir, "corpus")
if not args.data and not os.path.exists(os.path.join(data, "dataset.csv")):
    subprocess.run([os.path.join(here, "..", "scripts", "make-text-corpus"), data], check=True)


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("failed (exit %d): %s\n%s%s" % (out.returncode, " ".join(cmd), out.stdout, out.stderr[-3000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


storage = os.path.join(args.dir, "runs")
idle.wait(args.allow_load)
records, results = [], {}
with idle.Run() as load:
    run([os.path.join(examples, "text_classifier"), "--data", data, "--model", "bag", "--workers", "1", "--epochs",
         str(args.epochs), "--global-batch", "64", "--seed", "0", "--storage-path", storage, "--name", "default"])
records.append(load.record)
history = [json.loads(line) for line in open(os.path.join(storage, "default", "metrics.jsonl"))]
results["default"] = {"best_val_loss": min(r["val_loss"] for r in history), "epochs_run": len(history),
                      "wall_s": load.record.get("wall_s")}
for scheduler in ("fifo", "asha"):
    with idle.Run() as load:
        line = run([os.path.join(examples, "tune_text_classifier"), "--data", data, "--model", "bag", "--scheduler",
                    scheduler, "--samples", str(args.samples), "--epochs", str(args.epochs), "--concurrent",
                    str(args.concurrent), "--seed", "0", "--storage-path", storage, "--name", scheduler, "--fresh"])
    records.append(load.record)
    results[scheduler] = line
verdict = idle.verdict(records)
fifo, asha, default = results["fifo"], results["asha"], results["default"]
print("text tagger (bag), %d trials x %d epochs, %d at once, 1 worker each, on %d cores" %
      (args.samples, args.epochs, args.concurrent, os.cpu_count()))
print("default config (lr 1e-3, dropout 0): best val_loss %.4f" % default["best_val_loss"])
for name, r in (("fifo", fifo), ("asha", asha)):
    print("%s: best val_loss %.4f (%s %s), test_accuracy %.4f, %d epochs trained, %d trials stopped early, %.1f s" %
          (name, r["best_val_loss"], r["best_trial"], json.dumps(r["best_config"]), r["test_accuracy"], r["epochs_run"],
           r["stopped_early"], r["wall_s"]))
print("ASHA: %.0f%% of FIFO's epochs, %.0f%% of its time (saved %.1f s); its best beats the default by %.4f" %
      (100 * asha["epochs_run"] / fifo["epochs_run"], 100 * asha["wall_s"] / fifo["wall_s"], fifo["wall_s"] - asha["wall_s"],
       default["best_val_loss"] - asha["best_val_loss"]))
print(json.dumps({"results": results, "load": verdict}))
idle.refuse(verdict, args.allow_load)
