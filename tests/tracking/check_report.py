#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The README's own run, and the report a new user opens after it, read from the page in Chromium.

    check_report.py EXAMPLE WORKDIR [--docs-image PATH]

Runs what scripts/train runs (the CNN on Fashion-MNIST, 2 workers, one epoch), renders its
report.html in headless Chromium, and checks from the rendered DOM: the loss chart has at least 10
points, no chart has fewer than 2, a throughput chart over time, the final metrics as a table with
dates and durations (no 1.79e+09), the 10x10 confusion matrix, and no section without content.
The screenshot goes to WORKDIR/report.png; with --docs-image (or DTRAIN_UPDATE_DOCS=1, which
names docs/images/report.png) it is copied there too, for docs/run-directory.md.
"""
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys

from page_checks import check, finish, render


class Page(html.parser.HTMLParser):
    """The charts (each svg.curve with its polylines' point counts) and the page's sections."""

    def __init__(self):
        super().__init__()
        self.charts = []      # [metric, [(series, drawn points, data-points)]]
        self.sections = []    # [h2 text, whether anything is shown before the next h2: text, a chart, a table]
        self.in_h2 = False
        self.tables = {}      # id -> list of rows of cell texts
        self.table = None
        self.cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "h2":
            self.sections.append(["", False])
            self.in_h2 = True
        elif self.sections and not self.in_h2 and tag in ("svg", "table", "img"):
            self.sections[-1][1] = True
        if tag == "svg" and "curve" in a.get("class", ""):
            self.charts.append([a.get("data-metric"), []])
        if tag == "polyline" and self.charts:
            self.charts[-1][1].append((a.get("data-series"), len(a.get("points", "").split()), int(a.get("data-points", -1))))
        if tag == "table":
            self.table = self.tables.setdefault(a.get("id") or a.get("class") or "", [])
        if tag == "tr" and self.table is not None:
            self.table.append([])
        if tag in ("td", "th") and self.table is not None:
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "h2":
            self.in_h2 = False
        if tag in ("td", "th") and self.table is not None and self.cell is not None:
            self.table[-1].append(self.cell.strip())
            self.cell = None
        if tag == "table":
            self.table = None

    def handle_data(self, data):
        if self.in_h2:
            self.sections[-1][0] += data
        elif self.sections and data.strip():
            self.sections[-1][1] = True
        if self.cell is not None:
            self.cell += data


example, workdir = sys.argv[1], sys.argv[2]
docs_image = None
if "--docs-image" in sys.argv:
    docs_image = sys.argv[sys.argv.index("--docs-image") + 1]
elif os.environ.get("DTRAIN_UPDATE_DOCS") == "1":
    docs_image = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "images", "report.png")
shutil.rmtree(workdir, ignore_errors=True)
os.makedirs(workdir)
storage = os.path.join(workdir, "dtrain_runs")
# scripts/train's command, with the storage path in the work directory.
cmd = [example, "--workers", "2", "--epochs", "1", "--storage-path", storage]
proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
sys.stderr.write(proc.stderr[-2000:])
if proc.returncode != 0:
    sys.exit("the example exited with status %d" % proc.returncode)
line = json.loads(proc.stdout.strip().splitlines()[-1])
run_dir = line["run_dir"]
check(line["steps"] == 469 and line["epochs"] == 1, "the README's run: one epoch, %d steps" % line["steps"])

# The step history: a row every 10 steps (ProgressConfig::record_every) after the group's start.
steps_file = os.path.join(run_dir, "steps.jsonl")
if check(os.path.isfile(steps_file), "the run wrote its step history, steps.jsonl"):
    rows = [json.loads(l) for l in open(steps_file) if l.strip()]
    check(rows[0].get("event") == "start" and rows[0]["step"] == 0, "steps.jsonl opens with the group's start")
    values = [r for r in rows if "event" not in r]
    check([r["step"] for r in values] == list(range(10, 470, 10)), "steps.jsonl: a row every 10 steps")
    check(all(r["loss"] > 0 and r["samples_per_s"] > 0 for r in values), "every row has a loss and samples/s")
    check(values[-1]["loss"] < values[0]["loss"],
          "the loss falls: %.3f -> %.3f" % (values[0]["loss"], values[-1]["loss"]))

shot = os.path.join(workdir, "report.png")
dom = render(os.path.join(run_dir, "report.html"), shot, "1280,1400")
page = Page()
page.feed(dom)

charts = {metric: series for metric, series in page.charts}
print("charts: %s" % {m: [(n, p) for n, p, _ in s] for m, s in charts.items()})
check("loss" in charts and max(p for _, p, _ in charts["loss"] or [(None, 0, 0)]) >= 10,
      "the loss chart has at least 10 points")
check(all(p >= 2 for series in charts.values() for _, p, _ in series) and all(charts.values()),
      "no chart has fewer than 2 points")
check(all(p == d for series in charts.values() for _, p, d in series), "every line draws the points it declares")
check("throughput" in charts, "a throughput chart")
check('>seconds since the start<' in dom, "throughput over time")
final = {r[0]: r[1] for r in page.tables.get("final-metrics", [])[1:] if len(r) >= 2}
check(final.get("steps") == "469" and re.fullmatch(r"0\.\d+", final.get("test_accuracy", "")) is not None,
      "the final metrics table: steps and test accuracy")
check(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", final.get("first_step_unix", "")) is not None,
      "times as dates: first_step_unix %r" % final.get("first_step_unix"))
check(re.fullmatch(r"[\d.]+ s( \(\d+:\d\d\))?", final.get("train_loop_s", "")) is not None,
      "durations in seconds: train_loop_s %r" % final.get("train_loop_s"))
check(not re.search(r"\d[eE][+-]\d", re.sub(r"<[^>]*>", " ", dom)), "no number in e-notation on the page")
cm = page.tables.get("confusion-matrix", [])
check(len(cm) == 11 and all(len(r) == 11 for r in cm), "the 10x10 confusion matrix")
empty = [name for name, shown in page.sections if not shown]
check(page.sections and not empty, "no empty section: %s%s" % ([s for s, _ in page.sections],
                                                                  ", empty: %s" % empty if empty else ""))
check(not any(name.strip() == "Restarts" for name, _ in page.sections), "no restarts section for a run without one")

if docs_image and os.path.isfile(shot):
    os.makedirs(os.path.dirname(docs_image), exist_ok=True)
    shutil.copyfile(shot, docs_image)
    print("screenshot copied to " + os.path.realpath(docs_image))
finish()
