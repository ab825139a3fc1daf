# SPDX-License-Identifier: Apache-2.0
"""dtrain's MLflow file store, read by MLflow itself (scripts/python-env's mlflow).

    check_mlflow.py SCENARIOS WORKDIR

SCENARIOS is tests/signals/scenarios.cpp built with tracker::tensorboard<tracker::mlflow<>>. Three
runs of one storage path, each its own experiment of one store: "finished" (trained to the end),
"failing" (rank 1 throws at step 45; FailureConfig::throw_on_failure = false) and "stopped" (SIGINT
to the driver while it trains). While "stopped" still trains, MlflowClient sees it RUNNING with the
metrics reported so far. Then, through MlflowClient: the experiment, the run, its status, params
(params.json flattened), tags, every metric's full history equal to metrics.csv step by step (value,
step and timestamp), the latest values, and the artifacts (downloaded and compared with the run
directory's files). Then `mlflow server` on 127.0.0.1 (a free port) over the same store: its REST
API, and the run's page and its metric charts rendered by headless Chromium: the DOM names the run,
its status, metrics and tags, a chart's line passes through the loss's points, the screenshots are
not blank and show the line's colour. DTRAIN_UPDATE_DOCS=1
copies the screenshots to docs/images/mlflow-run.png and mlflow-metrics.png.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tool_checks import (check, render, csv_series, finish, flatten, free_port, jsonl_series, not_blank, require_venv, rows_jsonl, run,
                         start, unix_ms, wait_for_reports)

os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 opts in to the file store (docs/run-directory.md)
require_venv("mlflow", "PIL")
import mlflow  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

scenarios, workdir = sys.argv[1], os.path.abspath(sys.argv[2])
shutil.rmtree(workdir, ignore_errors=True)
os.makedirs(workdir)
storage = os.path.join(workdir, "runs")
store = os.path.join(storage, "mlruns")
uri = "file://" + store
print("MLflow", mlflow.__version__, flush=True)


def mlflow_key(name):
    """tracker::mlflow<>'s key(): characters MLflow does not take become '_'."""
    k = "".join(c if c.isalnum() and c.isascii() or c in "_-. /" else "_" for c in name).lstrip("/")
    while ".." in k:
        k = k.replace("..", "__", 1)
    return k or "_"


def the_run(client, name):
    """The experiment named `name` and its only run."""
    exp = client.get_experiment_by_name(name)
    if not check(exp is not None, "%s: MlflowClient finds the experiment by name" % name):
        return None, None
    runs = client.search_runs([exp.experiment_id])
    check(len(runs) == 1, "%s: the experiment has one run (%d)" % (name, len(runs)))
    return exp, runs[0] if runs else None


def history_of(client, run_id, key):
    return [(m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)]


# --- a run still training: RUNNING, and the metrics reported so far ---------------------------------
proc = start(scenarios, storage, "stopped", "--steps", 100000, "--every", 10, "--sleep-ms", 15)
check(wait_for_reports(storage, "stopped", proc, 3), "stopped: three reports while it trains")
client = MlflowClient(tracking_uri=uri)
exp, live = the_run(client, "stopped")
if live is not None:
    check(live.info.status == "RUNNING", "stopped: RUNNING while it trains (%s)" % live.info.status)
    check(live.info.end_time is None, "stopped: no end time while it trains")
    seen = history_of(client, live.info.run_id, "loss")
    reported = [(r["step"], unix_ms(r["timestamp"]), r["loss"]) for r in
                rows_jsonl(os.path.join(storage, "stopped", "metrics.jsonl"))]
    check(len(seen) >= 3 and seen == reported[:len(seen)],
          "stopped: the loss history MlflowClient reads while it trains is metrics.jsonl's (%d points)" % len(seen))
proc.send_signal(signal.SIGINT)
out, err = proc.communicate(timeout=120)
check(proc.returncode == 4 and "STOPPED" in out, "stopped: the driver stops on SIGINT (exit %s)" % proc.returncode)

# --- a finished and a failed run ---------------------------------------------------------------------
code, out, err = run(scenarios, storage, "finished", "--steps", 60, "--every", 10, "--sleep-ms", 0)
check(code == 0 and "status=finished" in out, "finished: the run finishes")
code, out, err = run(scenarios, storage, "failing", "--steps", 100, "--every", 10, "--sleep-ms", 0,
                     "--fail-step", 45, "--no-throw", 1)
check(code == 0 and "status=failed" in out, "failing: the run fails, Result::error returned")

# --- every run through MlflowClient ------------------------------------------------------------------
client = MlflowClient(tracking_uri=uri)
experiments = {e.name for e in client.search_experiments()}
check({"finished", "failing", "stopped"} <= experiments, "one store, an experiment per run name: %s" % sorted(experiments))
expected_status = {"finished": "FINISHED", "failing": "FAILED", "stopped": "KILLED"}
for name, status in expected_status.items():
    run_dir = os.path.join(storage, name)
    exp, r = the_run(client, name)
    if r is None:
        continue
    run_id = r.info.run_id
    outcome = json.load(open(os.path.join(run_dir, "outcome.json")))
    check(exp.tags.get("mlflow.experimentKind") == "custom_model_development",
          "%s: the experiment is model training (mlflow.experimentKind), not GenAI" % name)
    check(r.info.status == status, "%s: status %s (%s)" % (name, status, r.info.status))
    check(r.info.run_name == name and r.data.tags.get("mlflow.runName") == name, "%s: the run's name" % name)
    times = (r.info.start_time, r.info.end_time)
    want_times = (unix_ms(outcome["start_time"]), unix_ms(outcome["end_time"]))
    check(times == want_times, "%s: start and end times are outcome.json's%s" % (
        name, "" if times == want_times else ": %s vs %s" % (times, want_times)))
    check(r.info.lifecycle_stage == "active", "%s: lifecycle active" % name)
    check(r.data.tags.get("dtrain.outcome") == outcome["status"] and r.data.tags.get("mlflow.source.type") == "LOCAL"
          and r.data.tags.get("mlflow.source.name", "").endswith("tool_scenarios") and r.data.tags.get("mlflow.user"),
          "%s: tags (dtrain.outcome %s, source, user)" % (name, r.data.tags.get("dtrain.outcome")))
    if name == "failing":
        check("injected failure" in r.data.tags.get("mlflow.note.content", ""),
              "failing: the note (the run page's description) has the cause")
    # params: params.json flattened, every one
    want = {mlflow_key(k): v[:6000] for k, v in flatten(json.load(open(os.path.join(run_dir, "params.json")))).items()}
    check(r.data.params == want, "%s: params are params.json flattened (%d; differ: %s)" % (
        name, len(want), sorted(k for k in set(want) | set(r.data.params) if want.get(k) != r.data.params.get(k))[:5]))
    # metrics: every series of metrics.csv, step by step
    series, table = jsonl_series(run_dir), csv_series(run_dir)
    check(table is None if name == "failing" else table == series,
          "%s: metrics.csv %s" % (name, "is not written (the loop failed)" if name == "failing" else "is metrics.jsonl"))
    check({mlflow_key(k) for k in series} == set(r.data.metrics),
          "%s: the metrics are metrics.jsonl's series: %s" % (name, sorted(r.data.metrics)))
    check("val_loss" in r.data.metrics, "%s: 'val:loss' is 'val_loss' in MLflow" % name)
    for k, points in series.items():
        got = history_of(client, run_id, mlflow_key(k))
        want_points = [(s, unix_ms(t), v) for s, t, v in points]
        check(got == want_points, "%s: %s's history (%d points) is metrics.jsonl's, step, time and value%s" % (
            name, k, len(want_points), "" if got == want_points else ": %s vs %s" % (got[:3], want_points[:3])))
        check(r.data.metrics.get(mlflow_key(k)) == points[-1][2], "%s: %s's latest value" % (name, k))
    # artifacts: the run's files, as they are in the run directory
    names = {a.path for a in client.list_artifacts(run_id)}
    files = {"report.html", "params.json", "outcome.json", "steps.jsonl"} | ({"metrics.csv"} if table else set())
    check(files <= names, "%s: artifacts %s" % (name, sorted(names)))
    for f in sorted(files & names - {"report.html"}):
        got = client.download_artifacts(run_id, f, os.path.join(workdir, "download_" + name))
        check(open(got, "rb").read() == open(os.path.join(run_dir, f), "rb").read(),
              "%s: the %s artifact MLflow hands out is the run directory's" % (name, f))

# --- mlflow server, and its pages in Chromium --------------------------------------------------------
exp, r = the_run(client, "finished")
if r is None:
    finish()
port = free_port()
base = "http://127.0.0.1:%d" % port
log = open(os.path.join(workdir, "server.log"), "w")
server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "mlflow"), "server", "--backend-store-uri", uri,
                           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
try:
    up = False
    deadline = time.time() + 120
    while time.time() < deadline and server.poll() is None and not up:
        try:
            up = urllib.request.urlopen(base + "/health", timeout=5).read().strip() == b"OK"
        except OSError:
            time.sleep(0.5)
    if not check(up, "mlflow server answers on %s (log: %s)" % (base, log.name)):
        finish()
    got = json.load(urllib.request.urlopen(base + "/api/2.0/mlflow/runs/get?run_id=" + r.info.run_id, timeout=30))
    check(got["run"]["info"]["run_name"] == "finished" and got["run"]["info"]["status"] == "FINISHED",
          "the server's REST API returns the run")
    # The UI opens in its GenAI view unless told (a browser setting, not the store's):
    # ?workflowType=machine_learning is the "Model training" switch.
    page = "%s/#/experiments/%s/runs/%s" % (base, exp.experiment_id, r.info.run_id)
    shot = os.path.join(workdir, "mlflow-run.png")
    dom = render(page + "?workflowType=machine_learning", shot, "1400,1000", budget_ms=60000)
    check("finished" in dom and "tool_scenarios" in dom and "Finished" in dom,
          "the run page shows the run's name, source and status Finished")
    check(all(k in dom for k in ("val_loss", "score", "dtrain.outcome")), "the run page lists the run's metrics and tags")
    share, colours, _ = not_blank(shot)
    check(share > 0.02 and colours > 16, "the run page's screenshot is not blank (%.1f%% drawn, %d colours)" % (
        100 * share, colours))
    shot_chart = os.path.join(workdir, "mlflow-metrics.png")
    from PIL import Image

    def stroke_pixels(png):  # plotly's first trace colour, rgb(34, 114, 180)
        return sum(n for n, (r_, g_, b_) in Image.open(png).convert("RGB").getcolors(1 << 20)
                   if abs(r_ - 34) < 12 and abs(g_ - 114) < 12 and abs(b_ - 180) < 12)

    # The charts load after the page: a screenshot or DOM taken while they still spin is taken again.
    # MLflow draws only the charts in view: the window is tall enough for every metric's (three a
    # row; every report carries 7 numeric metrics here, the timing columns among them).
    rows = (len(series) + 2) // 3
    for attempt in range(1, 6):
        dom = render(page + "/model-metrics?workflowType=machine_learning", shot_chart,
                     size="1400,%d" % (400 + 420 * rows), budget_ms=60000)
        stroke = stroke_pixels(shot_chart)
        if stroke > 500 and 'class="js-line"' in dom:
            break
    check(all("finished (%s)" % mlflow_key(k) in dom for k in series), "the metric charts' legends name the run and "
          "each metric: %s" % sorted(mlflow_key(k) for k in series))
    lines = re.findall(r'class="js-line" d="M([^"]*)"', dom)
    points = len(csv_series(os.path.join(storage, "finished"))["loss"])
    check(any(len(d.split("L")) == points for d in lines),
          "a chart has a plotted line through the loss's %d points (plotly paths: %s)" % (
              points, [len(d.split("L")) for d in lines]))
    share, colours, _ = not_blank(shot_chart)
    check(share > 0.02 and stroke > 500, "the charts' screenshot shows plotted series (%d pixels of the line's "
          "colour, %.1f%% drawn; Chromium run %d)" % (stroke, 100 * share, attempt))
    if os.environ.get("DTRAIN_UPDATE_DOCS") == "1":
        docs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "images")
        shutil.copyfile(shot, os.path.join(docs, "mlflow-run.png"))
        shutil.copyfile(shot_chart, os.path.join(docs, "mlflow-metrics.png"))
finally:
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
finish()
