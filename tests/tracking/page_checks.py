# SPDX-License-Identifier: Apache-2.0
"""What the tracking tests share: named checks that are counted, and a page rendered by Chromium."""
import math
import os
import shutil
import subprocess
import tempfile

failures = []


def check(cond, what):
    """Prints "ok" or "FAIL" and `what`; a failure is counted for finish()."""
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def unix_ms(t):
    """A Unix time in seconds as the milliseconds dtrain writes for MLflow and TensorBoard: the nearest,
    a tie away from zero (C++'s llround). Python's round() sends a tie to the even neighbour, and
    about one time in 4,000 lands on an exact tie at today's magnitudes."""
    return math.floor(t * 1000 + 0.5)


def finish():
    """Exits 1 when a check failed, else 0."""
    print("%d check(s) failed" % len(failures) if failures else "all checks passed", flush=True)
    raise SystemExit(1 if failures else 0)


def render(page, screenshot, size, budget_ms=None):
    """`page` (a file, or a URL) in headless Chromium: a screenshot of `size` ("W,H") and the DOM it
    built; `budget_ms`, when given, is the virtual time its scripts get (a page that loads data)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not check(chromium is not None, "chromium is installed (scripts/install-deps)"):
        finish()
    url = page if "://" in page else "file://" + os.path.realpath(page)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", "--window-size=" + size]
    if budget_ms:
        flags.append("--virtual-time-budget=%d" % budget_ms)
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, *flags, "--user-data-dir=" + profile, "--screenshot=" + screenshot, url],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180)
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run([chromium, *flags, "--user-data-dir=" + profile, "--dump-dom", url],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=180).stdout
    check(os.path.isfile(screenshot), "Chromium wrote a screenshot: " + screenshot)
    return dom
