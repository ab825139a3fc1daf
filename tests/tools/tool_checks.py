# SPDX-License-Identifier: Apache-2.0
"""What the tools tests share: counted checks, the scenario program's runs, metrics.csv's series,
a free port, and a page rendered by headless Chromium."""
import csv
import json
import os
import socket
import subprocess
import sys
import time

# The counted checks and the Chromium render are the tracking tests' (tests/tracking/page_checks.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tracking"))
from page_checks import check, finish, render, unix_ms  # noqa: E402,F401


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


def not_blank(png):
    """The screenshot's share of pixels that are not the page's background, and its colour count."""
    from PIL import Image
    img = Image.open(png).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20) or []
    background = max(colours)[1] if colours else (255, 255, 255)
    total = img.width * img.height
    other = total - max(colours)[0] if colours else 0
    return other / total, len(colours), background
