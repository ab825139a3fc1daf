# SPDX-License-Identifier: Apache-2.0
"""tracker::tensorboard<>'s event files, read by TensorBoard itself (scripts/python-env's tensorboard).

    check_tensorboard.py SCENARIOS WORKDIR

SCENARIOS is tests/signals/scenarios.cpp built with tracker::tensorboard<tracker::mlflow<>>. A run
still training: TensorBoard's EventAccumulator reads the reports appended so far. A finished run:
one event file in <run>/tensorboard, its file_version "brain.Event:2", every scalar series equal to
metrics.csv step by step (the value as the float TensorBoard stores, the wall time as reported),
the params as a text summary holding params.json's values; MLflow's store is written beside it
(the composed tracker). Then `tensorboard --logdir <storage path>` on 127.0.0.1 (a free port): its
scalars API returns the same series for the run, and its page in headless Chromium (charts as SVG)
lists the run and its scalars and draws its curves.
DTRAIN_UPDATE_DOCS=1 copies the screenshot to docs/images/tensorboard.png.
"""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tool_checks import (check, render, csv_series, finish, flatten, free_port, not_blank, require_venv, rows_jsonl, run,
                         start, unix_ms, wait_for_reports)

require_venv("tensorboard", "PIL")
import tensorboard  # noqa: E402
from tensorboard.backend.event_processing import event_file_loader  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

scenarios, workdir = sys.argv[1], os.path.abspath(sys.argv[2])
shutil.rmtree(workdir, ignore_errors=True)
os.makedirs(workdir)
storage = os.path.join(workdir, "runs")
print("TensorBoard", tensorboard.__version__, flush=True)


def f32(v):
    """`v` as the float32 TensorBoard's scalars hold."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def accumulate(logdir):
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


# --- a run still training: the reports so far ------------------------------------------------------
live_storage = os.path.join(workdir, "live")  # apart: the server's page shows the finished run alone
proc = start(scenarios, live_storage, "live", "--steps", 100000, "--every", 10, "--sleep-ms", 15)
check(wait_for_reports(live_storage, "live", proc, 3), "live: three reports while it trains")
acc = accumulate(os.path.join(live_storage, "live", "tensorboard"))
seen = [(e.step, e.value) for e in acc.Scalars("loss")] if "loss" in acc.Tags()["scalars"] else []
reported = [(r["step"], f32(r["loss"])) for r in rows_jsonl(os.path.join(live_storage, "live", "metrics.jsonl"))]
check(len(seen) >= 3 and seen == reported[:len(seen)],
      "live: EventAccumulator reads the loss reported so far while the run trains (%d points)" % len(seen))
proc.send_signal(signal.SIGINT)
proc.communicate(timeout=120)

# --- a finished run ----------------------------------------------------------------------------------
code, out, err = run(scenarios, storage, "finished", "--steps", 60, "--every", 10, "--sleep-ms", 0)
check(code == 0 and "status=finished" in out, "finished: the run finishes")
run_dir = os.path.join(storage, "finished")
logdir = os.path.join(run_dir, "tensorboard")
files = sorted(os.listdir(logdir)) if os.path.isdir(logdir) else []
outcome = json.load(open(os.path.join(run_dir, "outcome.json")))
start_ms = unix_ms(outcome["start_time"])
check(len(files) == 1 and re.fullmatch(r"events\.out\.tfevents\.%d\..+\.%03d" % (start_ms // 1000, start_ms % 1000),
                                       files[0]) is not None,
      "one event file, events.out.tfevents.<start s>.<host>.<ms>: %s" % files)
check(os.path.isdir(os.path.join(storage, "mlruns")), "tracker::mlflow<>'s store is written too (composed)")
acc = accumulate(logdir)
first = next(iter(event_file_loader.EventFileLoader(os.path.join(logdir, files[0])).Load()), None) if files else None
check(first is not None and first.file_version == "brain.Event:2", "the first event's file_version is brain.Event:2")
check(acc.file_version == 2.0, "EventAccumulator reads file version 2 (%s)" % acc.file_version)
series = csv_series(run_dir)
tags = set(acc.Tags()["scalars"])
check(tags == set(series), "the scalar tags are metrics.csv's series: %s" % sorted(tags))
check("val:loss" in tags, "TensorBoard keeps the tag 'val:loss' as reported")
for k, points in series.items():
    got = [(e.step, e.wall_time, e.value) for e in acc.Scalars(k)] if k in tags else []
    want = [(s, t, f32(v)) for s, t, v in points]
    check(got == want, "%s: %d scalars equal metrics.csv, step, time and value%s" % (
        k, len(want), "" if got == want else ": %s vs %s" % (got[:3], want[:3])))
params = json.load(open(os.path.join(run_dir, "params.json")))
text = ""
if check("params" in acc.Tags()["tensors"], "the params are a text summary"):
    ev = acc.Tensors("params")[0]
    text = tensor_util.make_ndarray(ev.tensor_proto).item().decode()
    check(ev.step == 0 and text.startswith("| param | value |"), "the params summary is a markdown table at step 0")
table = {}
for line in text.splitlines()[2:]:
    cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
    if len(cells) == 2:
        table[cells[0]] = cells[1]
want = flatten(params)
check(table == want and len(want) > 20, "the params table is params.json flattened (%d rows; differ: %s)" % (
    len(want), sorted(k for k in set(want) | set(table) if want.get(k) != table.get(k))[:5]))
check("text" in acc.PluginTagToContent("text") or "params" in acc.PluginTagToContent("text"),
      "the params summary is the Text plugin's")

# --- a second fit() of the name (it resumes from its last checkpoint): a second file -----------------
code, out, err = run(scenarios, storage, "finished", "--steps", 60, "--every", 10, "--sleep-ms", 0)
again = sorted(os.listdir(logdir))
check(code == 0 and len(again) == 2 and files[0] in again, "a re-run of the name adds a second event file: %s" % again)
acc = accumulate(logdir)
check("loss" in acc.Tags()["scalars"] and [e.step for e in acc.Scalars("loss")][:len(series["loss"])] ==
      [s for s, _, _ in series["loss"]], "EventAccumulator reads both files, the first run's loss first")

# --- tensorboard's server: the scalars API and the page -----------------------------------------------
port = free_port()
base = "http://127.0.0.1:%d" % port
log = open(os.path.join(workdir, "server.log"), "w")
server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "tensorboard"), "--logdir", storage,
                           "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "0"],
                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
try:
    runs = {}
    deadline = time.time() + 120
    while time.time() < deadline and server.poll() is None and "finished/tensorboard" not in runs:
        try:
            runs = json.load(urllib.request.urlopen(base + "/data/plugin/scalars/tags", timeout=5))
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    if not check("finished/tensorboard" in runs, "tensorboard serves the run finished/tensorboard (%s)" % sorted(runs)):
        finish()
    q = urllib.parse.urlencode({"run": "finished/tensorboard", "tag": "loss"})
    got = json.load(urllib.request.urlopen(base + "/data/plugin/scalars/scalars?" + q, timeout=30))
    want = [[t, s, f32(v)] for s, t, v in series["loss"]]
    check(got == want, "the scalars API returns the loss of metrics.csv (%d points)" % len(want))
    shot = os.path.join(workdir, "tensorboard.png")
    # forceSVG: the charts drawn as SVG, not WebGL (headless Chromium here has no GPU), so that the
    # DOM holds each curve as a path with its run's colour.
    from PIL import Image

    def curves(dom):  # [(vertices, (r, g, b))] of the charts' series paths
        return [(len(d.split("L")), tuple(int(c) for c in rgb.split(",")))
                for d, rgb in re.findall(r'<path[^>]* d="M([^"]*)" style="fill: none; stroke: rgb\(([\d, ]+)\)', dom)]

    def pixels(png, rgb):
        return sum(n for n, c in Image.open(png).convert("RGB").getcolors(1 << 20)
                   if all(abs(a - b) < 16 for a, b in zip(c, rgb)))

    for attempt in range(1, 6):  # the charts load after the page: a screenshot taken early is taken again
        dom = render(base + "/?forceSVG=true&smoothing=0#timeseries", shot, "1400,1000", budget_ms=30000)
        drawn = curves(dom)
        colour = drawn[0][1] if drawn else (-100, -100, -100)
        if drawn and pixels(shot, colour) > 600:
            break
    check("finished/tensorboard" in dom and all(k in dom for k in series), "the page lists the run and its scalars")
    check(any(n == len(series["loss"]) for n, _ in drawn), "a curve passes through the loss's %d points (paths: %s)" % (
        len(series["loss"]), [n for n, _ in drawn]))
    share, colours, _ = not_blank(shot)
    check(share > 0.02 and pixels(shot, colour) > 600, "the page's screenshot shows the run's curves (%d pixels of "
          "its colour %s, %.1f%% drawn; Chromium run %d)" % (pixels(shot, colour), colour, 100 * share, attempt))
    if os.environ.get("DTRAIN_UPDATE_DOCS") == "1":
        docs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "images")
        shutil.copyfile(shot, os.path.join(docs, "tensorboard.png"))
finally:
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
finish()
