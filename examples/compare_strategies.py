#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Runs the example once with --strategy ddp and once with --strategy fsdp (the other arguments
the same) and checks that fsdp<> reaches ddp<>'s test accuracy within a tolerance while each worker
holds at most a fraction of ddp<>'s model state. Prints both JSON lines and the ratios.

    compare_strategies.py --accuracy-within 0.01 --state-ratio-max 0.6 -- fashion_mnist --model mlp ...
"""
import json
import subprocess
import sys

split = sys.argv.index("--")
options = dict(zip(sys.argv[1:split:2], sys.argv[2:split:2]))
command = sys.argv[split + 1:]
within = float(options.get("--accuracy-within", "0.01"))
ratio_max = float(options.get("--state-ratio-max", "0.6"))

lines = {}
for strategy in ("ddp", "fsdp"):
    name = ["--name", "compare_" + strategy, "--fresh"]
    proc = subprocess.run(command + ["--strategy", strategy] + name, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    sys.stderr.write(proc.stderr)
    print(proc.stdout, end="")
    if proc.returncode != 0:
        sys.exit("--strategy %s exited with status %d" % (strategy, proc.returncode))
    lines[strategy] = json.loads(proc.stdout.strip().splitlines()[-1])

ddp, fsdp = lines["ddp"], lines["fsdp"]
accuracy_gap = abs(fsdp["test_accuracy"] - ddp["test_accuracy"])
state_ratio = fsdp["model_state_bytes_per_worker"] / ddp["model_state_bytes_per_worker"]
speed_ratio = fsdp["train_samples_per_s"] / ddp["train_samples_per_s"]
print("test_accuracy ddp %.4f fsdp %.4f (gap %.4f, allowed %.4f)" %
      (ddp["test_accuracy"], fsdp["test_accuracy"], accuracy_gap, within))
print("model_state_bytes_per_worker fsdp/ddp %.3f (allowed %.3f)" % (state_ratio, ratio_max))
print("train_samples_per_s ddp %.1f fsdp %.1f (fsdp/ddp %.3f)" %
      (ddp["train_samples_per_s"], fsdp["train_samples_per_s"], speed_ratio))
print("peak_rss_mb ddp %.1f fsdp %.1f" % (ddp["peak_rss_mb"], fsdp["peak_rss_mb"]))
sys.exit(0 if accuracy_gap <= within and state_ratio <= ratio_max else 1)
