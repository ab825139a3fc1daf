#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The progress line as a person sees it: the example runs in a detached tmux session (a real
terminal) and the screen is read with `tmux capture-pane` while it trains and after it ends.

    progress_tmux.py EXAMPLE WORKDIR

Normal verbosity: one line, redrawn in place (epoch, step/total, samples/s, loss, ETA), whose step
and epoch advance and which ends at 100% with ETA 00:00; never two progress lines on the screen.
--verbose: the same single live line, with a line per report above it. --quiet: no progress line
and no line of dtrain's but warnings.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

example, workdir = os.path.realpath(sys.argv[1]), sys.argv[2]
shutil.rmtree(workdir, ignore_errors=True)
os.makedirs(workdir)
socket = "dtrain-progress-%d" % os.getpid()  # a tmux server of our own
failures = []
STEPS = 900  # two epochs of 469 steps, cut at 900
LINE = re.compile(r"^epoch ([12])/2 \| step (\d+)/%d \((\d+)%%\) \| ([\d.]+) samples/s \| loss (\d+\.\d{4}) \| ETA (\d\d:\d\d)\s*$" % STEPS)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
    return cond


def tmux(*args, **kw):
    return subprocess.run(["tmux", "-L", socket, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def run_in_terminal(name, flags):
    cmd = [example, "--model", "mlp", "--workers", "1", "--epochs", "2", "--max-steps", str(STEPS),
           "--storage-path", os.path.join(workdir, "runs"), "--name", name, *flags]
    shell = "cd %s && %s; echo EXITED $?; sleep 120" % (shlex.quote(workdir), " ".join(map(shlex.quote, cmd)))
    started = tmux("new-session", "-d", "-s", name, "-x", "200", "-y", "50", shell)
    if started.returncode != 0:
        sys.exit("tmux new-session failed: " + started.stderr)
    screens = []
    deadline = time.time() + 120
    while time.time() < deadline:
        screen = tmux("capture-pane", "-p", "-t", name).stdout
        screens.append(screen)
        if "EXITED" in screen:
            break
        time.sleep(0.05)
    tmux("kill-session", "-t", name)
    return screens


# A session that lives as long as the test keeps the server up between the runs' sessions (a
# server whose last session ends exits, and a session started meanwhile can be lost).
tmux("new-session", "-d", "-s", "keep", "sleep 600")
try:
    # --- normal: one updating line ---------------------------------------------------------------
    screens = run_in_terminal("normal", [])
    final = screens[-1]
    print("final screen:\n" + final)
    check("EXITED 0" in final, "the example ran to the end in the terminal")
    seen, lines = [], set()
    for s in screens:
        progress = [l for l in s.splitlines() if "| step " in l]
        if len(progress) > 1:
            check(False, "two progress lines on one screen:\n" + s)
            break
        if progress:
            m = LINE.match(progress[0])
            if m is None:
                check(False, "the progress line reads epoch, step/total, samples/s, loss, ETA: %r" % progress[0])
                break
            lines.add(progress[0].rstrip())
            seen.append((int(m.group(1)), int(m.group(2)), m.group(6)))
    print("progress lines seen:\n  " + "\n  ".join(sorted(lines, key=lambda l: int(LINE.match(l).group(2)))))
    check(len(seen) > 0 and all(float(LINE.match(l).group(4)) > 0 for l in lines),
          "every progress line read as expected, with a samples/s above 0")
    steps = sorted({s for _, s, _ in seen})
    check(len(steps) >= 3, "the line was redrawn with advancing steps: %s" % steps[:12])
    check({e for e, _, _ in seen} == {1, 2}, "the epoch advanced from 1/2 to 2/2")
    check(any(eta != "00:00" for _, s, eta in seen if s < STEPS), "an ETA was shown while training")
    last = [l for l in final.splitlines() if "| step " in l]
    check(len(last) == 1 and LINE.match(last[0]) is not None and "step %d/%d (100%%)" % (STEPS, STEPS) in last[0]
          and last[0].rstrip().endswith("ETA 00:00"), "the final screen holds one progress line, at 100%%: %s" % last)
    check(re.search(r"^  accuracy 0\.\d{4}$", final, re.M) is not None, "the example's output follows on lines of its own")

    # --- verbose: report lines above the live line ----------------------------------------------
    final = run_in_terminal("verbose", ["--verbose", "--report-every", "300"])[-1]
    print("final screen (--verbose):\n" + final)
    reports = re.findall(r"^dtrain: report (\d+): .*train_loss=", final, re.M)
    check(reports[:3] == ["1", "2", "3"], "--verbose: a line per report: %s" % reports)
    check(re.search(r"^dtrain: evaluation best_checkpoint_test: accuracy=0\.\d+", final, re.M) is not None,
          "--verbose: the evaluation's line")
    check(len([l for l in final.splitlines() if "| step " in l]) == 1, "--verbose: still one progress line")

    # --- quiet: nothing ---------------------------------------------------------------------------
    final = run_in_terminal("quiet", ["--quiet"])[-1]
    print("final screen (--quiet):\n" + final)
    # Quiet still shows warnings (Verbosity::quiet), such as OpenBLAS's generic kernel on this CPU.
    chatter = [l for l in final.splitlines() if l.startswith("dtrain:") and not l.startswith("dtrain: warning:")]
    check("EXITED 0" in final and "| step " not in final and not chatter, "--quiet: no progress line")
finally:
    tmux("kill-server")

print("%d check(s) failed" % len(failures) if failures else "all checks passed")
sys.exit(1 if failures else 0)
