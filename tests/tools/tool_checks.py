# SPDX-License-Identifier: Apache-2.0
"""What the tools tests share: counted checks, the scenario program's runs, metrics.csv's series,
a free port, and a page rendered by headless Chromium."""
import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

failures = []


def check(cond, what):
    """Prints "ok" or "FAIL" and `what`; a failure is counted for finish()."""
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def finish():
    print("%d check(s) failed" % len(failures) if failures else "all checks passed", flush=True)
    raise SystemExit(1 if failures else 0)


def require_venv(*modules):
    """The tools come from scripts/python-env's environment: say how to make it when a module is missing."""
    missing = []
    for m in modules:
        try:
            __import__(m)
        except ImportError:
            missing.append(m)
    if missing:
        check(False, "%s importable by %s (run scripts/python-env, or scripts/install-deps)" % (missing, sys.executable))
        finish()


def start(scenarios, storage, name, *args):
    cmd = [scenarios, "--name", name, "--storage", storage] + [str(a) for a in args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(scenarios, storage, name, *args, timeout=300):
    proc = start(scenarios, storage, name, *args)
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        sys.stdout.write(out + err)
    return proc.returncode, out, err


def wait_for_reports(storage, name, proc, n, timeout=120):
    """Waits until metrics.jsonl of run `name` has `n` rows (or the process ended)."""
    history = os.path.join(storage, name, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(history) and len(rows_jsonl(history)) >= n:
            return True
        time.sleep(0.05)
    return False


def rows_jsonl(path):
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line being written
                pass
    return rows


BOOKKEEPING = ("timestamp", "step", "iteration")


def is_series(key, value):
    """A metric that trackers record as a series (tracker::mlflow<>, tracker::tensorboard<>)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and key not in BOOKKEEPING
            and not key.endswith("_unix"))


def jsonl_series(run_dir):
    """metrics.jsonl as {metric: [(step, timestamp, value)]}, the numeric series only, in row order."""
    series = {}
    for row in rows_jsonl(os.path.join(run_dir, "metrics.jsonl")):
        for k, v in row.items():
            if is_series(k, v):
                series.setdefault(k, []).append((int(row["step"]), float(row["timestamp"]), float(v)))
    return series


def csv_series(run_dir):
    """metrics.csv as {metric: [(step, timestamp, value)]}, the numeric series only, in row order;
    None when the run has no metrics.csv (written when the loop ends: not for a failed run)."""
    series = {}
    path = os.path.join(run_dir, "metrics.csv")
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            for k, v in row.items():
                if k in BOOKKEEPING or k.endswith("_unix") or v in ("", None):
                    continue
                try:
                    value = float(v)
                except ValueError:
                    continue
                series.setdefault(k, []).append((int(float(row["step"])), float(row["timestamp"]), value))
    return series


def flatten(j, prefix="", out=None):
    """params.json as tracking::flatten makes it: "a.b.c" -> text (strings bare, null "None", the rest JSON)."""
    out = {} if out is None else out
    if isinstance(j, dict):
        for k, v in j.items():
            flatten(v, k if not prefix else prefix + "." + k, out)
    elif isinstance(j, str):
        out[prefix] = j
    elif j is None:
        out[prefix] = "None"
    else:
        out[prefix] = json.dumps(j, separators=(",", ":"))
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium(url, screenshot, size="1400,1000", budget_ms=20000):
    """`url` in headless Chromium, given `budget_ms` of virtual time for its scripts: a screenshot
    and the DOM it built."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not check(exe is not None, "chromium is installed (scripts/install-deps)"):
        finish()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--virtual-time-budget=%d" % budget_ms, "--hide-scrollbars", "--window-size=" + size]
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([exe, *flags, "--user-data-dir=" + profile, "--screenshot=" + screenshot, url],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180)
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run([exe, *flags, "--user-data-dir=" + profile, "--dump-dom", url],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=180).stdout
    check(os.path.isfile(screenshot), "Chromium wrote a screenshot: " + screenshot)
    return dom


def not_blank(png):
    """The screenshot's share of pixels that are not the page's background, and its colour count."""
    from PIL import Image
    img = Image.open(png).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20) or []
    background = max(colours)[1] if colours else (255, 255, 255)
    total = img.width * img.height
    other = total - max(colours)[0] if colours else 0
    return other / total, len(colours), background
