#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""SIGINT to an example's driver stops its training at the next step (issue 30).

    test_example_stop.py RUN_DIR [--every N] [--checkpoints] [--delay-max S] -- COMMAND...

Starts COMMAND (an example program with a long run: many epochs) in its own working directory,
waits until rank 0's steps.jsonl in RUN_DIR shows training under way, sends SIGINT to the driver at
a random point up to --delay-max seconds later (default 1; 0 for a run that may end within a
second on an idle machine, as the quickstart's two epochs do), and checks: the training stopped within 2 s of the next step (the last step's time
is estimated from steps.jsonl's time stamps, a row every N optimizer steps, and the step count of
the last report in metrics.jsonl); the driver exited within 30 s; outcome.json says "stopped" and
names SIGINT, and so does the driver's output; with --checkpoints, the latest checkpoint is the
one saved after the stop, at the last step, so a re-run resumes where the stop cut in.

Fails on a loop that trains to the end of its epochs (or of the 30 s grace) after the signal.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def rows(path):
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:  # a line being written
                    pass
    return out


ap = argparse.ArgumentParser()
ap.add_argument("run_dir")
ap.add_argument("--every", type=int, default=10, help="steps.jsonl's row interval (ProgressConfig::record_every)")
ap.add_argument("--checkpoints", action="store_true", help="the example saves a checkpoint at each epoch's end")
ap.add_argument("--cwd", default=None)
ap.add_argument("--delay-max", type=float, default=1.0, help="the signal comes up to this many seconds after training shows")
split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
a = ap.parse_args(sys.argv[1:split])
command = sys.argv[split + 1:]
steps_file = os.path.join(a.run_dir, "steps.jsonl")
rng = random.Random(30)

shutil.rmtree(a.run_dir, ignore_errors=True)  # no rows of an earlier run
if a.cwd:
    os.makedirs(a.cwd, exist_ok=True)
proc = subprocess.Popen(command, cwd=a.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        env=dict(os.environ, DTRAIN_VERBOSITY="quiet"))
# Training under way: two rows of steps after the start (the first step's row carries no rate).
deadline = time.time() + 240
while time.time() < deadline and proc.poll() is None:
    if len([r for r in rows(steps_file) if "loss" in r]) >= 2:
        break
    time.sleep(0.05)
running = proc.poll() is None
if not check(running, "the example trains (steps.jsonl grows) and is still running"):
    out = proc.communicate(timeout=600)[0] if not running else ""
    print(out[-3000:])
    sys.exit(1)
time.sleep(rng.uniform(0.0, a.delay_max))
sent = time.time()
proc.send_signal(signal.SIGINT)
try:
    out = proc.communicate(timeout=120)[0]
except subprocess.TimeoutExpired:
    proc.kill()
    out = proc.communicate()[0]
exited = time.time() - sent
print(out[-2500:])

history = rows(os.path.join(a.run_dir, "metrics.jsonl"))
trained = [r for r in rows(steps_file) if "loss" in r and "event" not in r]
last_step = int(history[-1]["step"]) if history else None
# The time of the last step: the last row at or before it, plus the steps since at the run's rate.
before = [r for r in trained if last_step is not None and r["step"] <= last_step]
if len(before) >= 2 and last_step is not None:
    first, last = before[0], before[-1]
    per_step = (last["timestamp"] - first["timestamp"]) / max(1, last["step"] - first["step"])
    step_at = last["timestamp"] + (last_step - last["step"]) * per_step
    stopped_after = step_at - sent
else:
    per_step, stopped_after = float("nan"), float("inf")
print("measured: last step %s, %.2f s after SIGINT (a step takes %.3f s); the driver exited %.2f s after it"
      % (last_step, stopped_after, per_step, exited))
check(stopped_after <= 2.0 + per_step,
      "training stopped within 2 s of the next step: the last step (%s) %.2f s after SIGINT" % (last_step, stopped_after))
check(exited < 30, "the driver exited %.1f s after SIGINT (within the 30 s grace)" % exited)
outcome = json.load(open(os.path.join(a.run_dir, "outcome.json")))
check(outcome["status"] == "stopped" and "SIGINT" in (outcome.get("error") or ""),
      "outcome.json: stopped by SIGINT (%s)" % outcome["status"])
check("stopped by SIGINT" in out, "the driver says it was stopped by SIGINT")
if a.checkpoints:
    index = json.load(open(os.path.join(a.run_dir, "checkpoints.json")))
    latest = [c for c in index["checkpoints"] if c.get("latest")]
    check(bool(latest) and latest[0]["step"] == last_step,
          "the latest checkpoint is the one saved after the stop, at step %s (%s)"
          % (last_step, latest and latest[0]["step"]))
    check("to resume" in out, "the driver says a re-run resumes")
else:
    check("starts over" in out, "a Trainer without checkpoints says a re-run starts over")
print("%d failures" % len(failures))
sys.exit(1 if failures else 0)
