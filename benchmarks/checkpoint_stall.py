#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The checkpoint stall of a large model, asynchronous and synchronous side by side (issue 15).

    benchmarks/checkpoint_stall.py [--program build/benchmarks/checkpoint_stall] [--mb 105]
                                   [--checkpoints 3] [--seconds-between 8] [--dir /dev/shm/...] [--repeats 3]

Runs benchmarks/checkpoint_stall.cpp alternately with checkpointer::directory<true> (async) and
directory<false> (sync), `repeats` times each, and prints the medians: the seconds the training
thread was held up by checkpoints (blocked), the seconds the writes took, the ratio blocked / write
(issue 15's target: <= 0.05 async), the first checkpoint() apart from the later ones (the first
copies into new memory, the later ones into the previous snapshot's buffers) and the later ones'
share of a write, async's blocked against sync's, and the step time while a write runs beside it
against a step with none (the cores the writer takes from training).
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
p.add_argument("--program", type=timed_build.program,
               default=os.path.join(here, "..", "build", "benchmarks", "checkpoint_stall"))
p.add_argument("--mb", type=float, default=105)
p.add_argument("--checkpoints", type=int, default=3)
p.add_argument("--seconds-between", type=float, default=8)
p.add_argument("--dir", default="/dev/shm/dtrain_checkpoint_stall",
               help="where the checkpoints go (the default, tmpfs, leaves the disk out: write_s is then "
                    "serialization, the denominator that makes the ratio strictest)")
p.add_argument("--repeats", type=int, default=3)
idle.add_argument(p)
args = p.parse_args()
if not os.path.exists(args.program):
    sys.exit("checkpoint_stall.py: %s does not exist; build it first (cmake --build build --target checkpoint_stall)"
             % args.program)
if args.repeats < 1:
    sys.exit("checkpoint_stall.py: --repeats must be at least 1")

env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
runs = {"async": [], "sync": []}
loads = []
idle.wait(args.allow_load)
for _ in range(args.repeats):
    for mode in ("async", "sync"):
        cmd = [args.program, "--mb", str(args.mb), "--checkpoints", str(args.checkpoints), "--seconds-between",
               str(args.seconds_between), "--dir", args.dir] + (["--sync"] if mode == "sync" else [])
        with idle.Run() as load:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        loads.append(load.record)
        if out.returncode != 0:
            sys.exit("failed (exit %d): %s\n%s%s" % (out.returncode, " ".join(cmd), out.stdout, out.stderr))
        runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))


def med(mode, key):
    return statistics.median(r[key] for r in runs[mode])


a, s = runs["async"][0], runs["sync"][0]
print("model %.0f MB of parameters (+ Adam's two copies), %d checkpoints a run, median of %d runs, load average %s"
      % (a["model_mb"], a["checkpoints"], args.repeats, " ".join("%.2f" % x for x in os.getloadavg())))
for mode in ("async", "sync"):
    n = a["checkpoints"]
    if n > 1 and all("first_checkpoint_s" in r for r in runs[mode]):
        later = statistics.median((r["in_checkpoint_s"] - r["first_checkpoint_s"]) / (n - 1) for r in runs[mode])
        print("%-5s checkpoint(): first %.3f s, later ones %.3f s each; a later one / one write %.3f"
              % (mode, med(mode, "first_checkpoint_s"), later, later / (med(mode, "write_s") / n)))
    print("%-5s blocked %.3f s (in checkpoint() %.3f, in report() %.3f) | writes %.3f s | blocked / write %.3f | "
          "step beside a write %.1f ms, without %.1f ms (x%.2f)"
          % (mode, med(mode, "blocked_s"), med(mode, "in_checkpoint_s"), med(mode, "in_report_s"), med(mode, "write_s"),
             med(mode, "blocked_over_write"), 1e3 * med(mode, "writing_step_s"), 1e3 * med(mode, "quiet_step_s"),
             med(mode, "writing_step_s") / med(mode, "quiet_step_s")))
print("async blocked / sync blocked: %.3f" % (med("async", "blocked_s") / med("sync", "blocked_s")))
if med("async", "write_s") / max(1, a["checkpoints"]) > args.seconds_between:
    print("warning: a write took longer than --seconds-between; checkpoint() waited for the previous write, "
          "so blocked includes that wait: raise --seconds-between")
idle.refuse(idle.verdict(loads), args.allow_load)
