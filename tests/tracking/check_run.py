#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The example's run directory, file by file, and its report in a real browser.

    check_run.py EXAMPLE WORKDIR [--no-browser]

Runs the Fashion-MNIST example (MLP, 2 workers, a short run) with tracker::mlflow<>, then checks:
params.json, metrics.jsonl / metrics.csv, checkpoints.json, evaluations.json, outcome.json, the
MLflow file store under the storage path's mlruns/ (read the way mlflow/store/tracking/file_store.py reads it), and
report.html rendered by headless Chromium: the screenshot is not blank and shows the curves' colour,
and the DOM holds the SVG curves, the final metrics table and the 10x10 confusion matrix.
"""
import csv
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

from page_checks import check, finish, render, unix_ms


def load(path):
    with open(path) as f:
        return json.load(f)


example, workdir = sys.argv[1], sys.argv[2]
browser = "--no-browser" not in sys.argv
shutil.rmtree(workdir, ignore_errors=True)
os.makedirs(workdir)
name = "tracked"
run_dir = os.path.join(workdir, "runs", name)
steps, every = 120, 20
cmd = [example, "--model", "mlp", "--workers", "2", "--epochs", "2", "--max-steps", str(steps),
       "--report-every", str(every), "--storage-path", os.path.join(workdir, "runs"), "--name", name]
proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
sys.stdout.write(proc.stdout)
sys.stderr.write(proc.stderr)
if proc.returncode != 0:
    sys.exit("the example exited with status %d" % proc.returncode)
line = json.loads(proc.stdout.strip().splitlines()[-1])

# --- the example prints the best checkpoint's evaluation ----------------------------------------
for word in ("accuracy", "precision", "recall", "F1"):
    check(re.search(r"^  %s \d\.\d{4}" % word, proc.stdout, re.M) is not None, "the example prints " + word)
check(re.search(r"test sample 0: .+ \(p=0\.\d+\), true class ", proc.stdout) is not None,
      "the example prints a batch prediction with a class name and its probability")
# stderr is not a terminal here: plain progress lines, the last one at the final step.
check(re.search(r"^dtrain: epoch 1/2 \| step %d/%d \(100%%\) \| [\d.]+ samples/s \| loss [\d.]+ \| ETA 00:00$"
                % (steps, steps), proc.stderr, re.M) is not None, "a plain progress line ends the run on stderr")

# --- params.json ------------------------------------------------------------------------------
params = load(os.path.join(run_dir, "params.json"))
check(params["format"] == 1, "params.json format 1")
pol = params["policies"]
check({k: pol[k]["name"] for k in pol} == {"backend": "gloo", "sampler": pol["sampler"]["name"],
                                           "checkpointer": "directory", "strategy": "ddp",
                                           "precision": "fp32", "tracker": "mlflow"},
      "params.json names every policy: %s" % {k: pol[k]["name"] for k in pol})
check("ddp<" in pol["strategy"]["type"], "a policy's numbers show in its type: " + pol["strategy"]["type"])
check(params["scaling"] == {"num_workers": 2, "threads_per_worker": 1, "min_workers": 2, "use_gpu": False}, "params.json scaling")
check(params["run"]["name"] == name and params["run"]["progress"]["verbosity"] == "normal", "params.json run")
check(params["checkpoint"] == {"num_to_keep": 2, "score_attribute": "test_accuracy", "score_order": "max"},
      "params.json checkpoint config")
check(params["failure"] == {"max_failures": 0, "max_repeated_failures": 3, "throw_on_failure": True,
                            "stop_grace_ms": 30000, "stop_poll_ms": 100, "restart_backoff_ms": 500,
                            "restart_backoff_max_ms": 30000, "heartbeat_timeout_ms": 10000,
                            "progress_timeout_ms": 0}, "params.json failure config: %s" % params["failure"])
check(params["run"]["start"] in ("resume", "fresh") and "seed" in params["run"], "params.json start and seed")
check(params["train_loop_config"]["model"] == "mlp" and params["train_loop_config"]["max_steps"] == steps,
      "params.json train_loop_config")

# --- metrics history ------------------------------------------------------------------------------
rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.strip()]
check(len(rows) == steps // every + 1, "metrics.jsonl: %d rows (%d step reports and an epoch's)" % (len(rows), steps // every))
check(all({"iteration", "epoch", "step", "timestamp"} <= set(r) for r in rows), "every row has iteration, epoch, step, timestamp")
check([r["step"] for r in rows[:-1]] == list(range(every, steps + 1, every)), "step reports at every %d steps" % every)
check([r["iteration"] for r in rows] == list(range(1, len(rows) + 1)), "iterations count the reports")
check(all(a["timestamp"] <= b["timestamp"] for a, b in zip(rows, rows[1:])), "wall times increase")
# Ray's timing columns: per report, the seconds since the previous one, the total, and the samples
# both ranks took from the Trainer's Sampler in between (every=20 steps of the global batch 128).
check(all({"time_this_iter_s", "time_total_s", "samples_per_s"} <= set(r) for r in rows),
      "every row has time_this_iter_s, time_total_s and samples_per_s")
check(all(r["time_this_iter_s"] > 0 for r in rows), "time_this_iter_s is positive")
check(all(abs((b["time_total_s"] - a["time_total_s"]) - b["time_this_iter_s"]) < 1e-3 for a, b in zip(rows, rows[1:])),
      "time_total_s grows by each report's time_this_iter_s")
check(all(abs((b["timestamp"] - a["timestamp"]) - b["time_this_iter_s"]) < 0.05 for a, b in zip(rows, rows[1:])),
      "time_this_iter_s is the wall time between reports")
trained = [r["samples_per_s"] * r["time_this_iter_s"] for r in rows[:-1]]
check(all(abs(t - every * 128) < 1e-6 * every * 128 for t in trained),
      "samples_per_s x time_this_iter_s = the %d samples of each %d steps: %s" % (every * 128, every, trained))
with open(os.path.join(run_dir, "metrics.csv")) as f:
    table = list(csv.DictReader(f))
check(len(table) == len(rows) and float(table[-1]["test_accuracy"]) == rows[-1]["test_accuracy"],
      "metrics.csv is the same table")

# --- checkpoints.json -----------------------------------------------------------------------------
index = load(os.path.join(run_dir, "checkpoints.json"))
cks = index["checkpoints"]
check(index["score_attribute"] == "test_accuracy" and index["score_order"] == "max", "index: score attribute and order")
check(len(cks) == 1 and cks[0]["directory"] == "checkpoint_%06d" % len(rows), "index lists the checkpoint")
check(cks[0]["best"] and cks[0]["latest"] and index["best"] == index["latest"] == cks[0]["directory"], "index: best and latest")
check(cks[0]["score"] == rows[-1]["test_accuracy"] and cks[0]["step"] == steps, "index: score and step")
check(os.path.isfile(os.path.join(cks[0]["path"], "manifest.json")), "index: path is the checkpoint")

# --- evaluations.json -----------------------------------------------------------------------------
evals = load(os.path.join(run_dir, "evaluations.json"))["evaluations"]
check(len(evals) == 1 and evals[0]["name"] == "best_checkpoint_test", "one evaluation: the best checkpoint")
ev = evals[0]
cm = ev["confusion_matrix"]
check(len(cm) == 10 and all(len(r) == 10 for r in cm) and sum(map(sum, cm)) == 10000, "10x10 confusion matrix of 10000 samples")
check(ev["class_names"][0] == "T-shirt/top" and ev["class_names"][9] == "Ankle boot", "Fashion-MNIST's class names")
check(abs(ev["metrics"]["accuracy"] - sum(cm[i][i] for i in range(10)) / 10000) < 1e-12, "accuracy is the trace / total")
check(abs(ev["metrics"]["accuracy"] - rows[-1]["test_accuracy"]) < 1e-12, "the best checkpoint's accuracy is its reported one")
check(line["best_accuracy"] == round(ev["metrics"]["accuracy"], 4), "the JSON line carries the evaluation")

# --- outcome.json ---------------------------------------------------------------------------------
out = load(os.path.join(run_dir, "outcome.json"))
check(out["status"] == "finished" and out["error"] is None and out["restarts"] == 0 and out["failures"] == [],
      "outcome: finished, no error, no restarts")
check(out["end_time"] >= out["start_time"] and out["reports"] == len(rows), "outcome: times and report count")

# --- MLflow's file store, read as file_store.py reads it -------------------------------------------
store = os.path.join(workdir, "runs", "mlruns")  # one store per storage path, beside the run directories
check(os.path.isdir(os.path.join(store, ".trash")), "mlruns/.trash")
check(not os.path.exists(os.path.join(run_dir, "mlruns")), "no store inside the run directory")
experiments = [d for d in os.listdir(store) if d != ".trash"]
check(len(experiments) == 1 and experiments[0].isdigit() and experiments[0] != "0",
      "one experiment, with a numeric id (not Default's 0): %s" % experiments)
exp_id = experiments[0]
exp = yaml.safe_load(open(os.path.join(store, exp_id, "meta.yaml")))
check(set(exp) == {"artifact_location", "creation_time", "experiment_id", "last_update_time", "lifecycle_stage", "name"},
      "experiment meta.yaml keys")
check(exp["experiment_id"] == exp_id and exp["name"] == name and exp["lifecycle_stage"] == "active",
      "the experiment is named after the run, active")
check(exp["artifact_location"] == "file://" + os.path.realpath(os.path.join(store, exp_id)), "experiment artifact_location")
runs = [d for d in os.listdir(os.path.join(store, exp_id)) if os.path.isdir(os.path.join(store, exp_id, d))
        and d not in ("tags", "datasets", "traces")]
check(len(runs) == 1, "one run in the experiment")
run_id = runs[0]
rdir = os.path.join(store, exp_id, run_id)
check(re.fullmatch(r"[a-zA-Z0-9][\w\-]{0,255}", run_id) is not None, "run id passes MLflow's _validate_run_id")
meta = yaml.safe_load(open(os.path.join(rdir, "meta.yaml")))
check(set(meta) == {"artifact_uri", "end_time", "entry_point_name", "experiment_id", "lifecycle_stage", "run_id", "run_name",
                    "run_uuid", "source_name", "source_type", "source_version", "start_time", "status", "tags", "user_id",
                    "deleted_time"}, "run meta.yaml keys are those of _make_persisted_run_info_dict")
check(meta["run_id"] == meta["run_uuid"] == run_id and meta["experiment_id"] == exp_id, "run ids and experiment id")
check(meta["status"] == 3 and meta["lifecycle_stage"] == "active" and meta["source_type"] == 4, "status FINISHED (3), active, LOCAL")
check(isinstance(meta["start_time"], int) and isinstance(meta["end_time"], int) and meta["end_time"] >= meta["start_time"],
      "start and end times in ms")
check(abs(meta["start_time"] / 1000 - out["start_time"]) < 0.01, "start time matches outcome.json")
check(meta["artifact_uri"] == "file://" + os.path.realpath(os.path.join(rdir, "artifacts")) and meta["tags"] == [],
      "artifact_uri points into the run")
check(meta["run_name"] == name and open(os.path.join(rdir, "tags", "mlflow.runName")).read() == name, "run name and mlflow.runName tag")


def walk(sub):  # as FileStore._get_resource_files: relative paths of every file below
    base = os.path.join(rdir, sub)
    return sorted(os.path.relpath(os.path.join(r, f), base) for r, _, fs in os.walk(base) for f in fs)


name_ok = re.compile(r"^[/\w.\- ]*$")  # no ':': MLflow releases before mid-2024 reject it
metric_files = walk("metrics")
check(all(name_ok.match(m) and not m.startswith("/") for m in metric_files), "metric names pass MLflow's validation")


def history(key):  # FileStore._get_metric_from_line
    out = []
    for l in open(os.path.join(rdir, "metrics", key)):
        parts = l.strip().split(" ")
        assert len(parts) == 3, l
        out.append((int(parts[0]), float(parts[1]), int(parts[2])))
    return out


for key in metric_files:
    try:
        history(key)
    except Exception as e:  # noqa: BLE001
        check(False, "metrics/%s: %s" % (key, e))
h = history("train_loss")
check([s for _, _, s in h] == list(range(every, steps + 1, every)), "train_loss history by step")
check([v for _, v, _ in h] == [r["train_loss"] for r in rows[:-1]], "train_loss values equal metrics.jsonl's")
check([t for t, _, _ in h] == [unix_ms(r["timestamp"]) for r in rows[:-1]], "timestamps in ms")
ta = history("test_accuracy")
check(len(ta) == 1 and ta[0][1] == rows[-1]["test_accuracy"] and ta[0][2] == steps, "test_accuracy at its step")
check(history("best_checkpoint_test/f1_macro")[0][1] == ev["metrics"]["f1_macro"], "the evaluation's metrics are MLflow metrics")
check(not any(k in metric_files for k in ("timestamp", "step", "iteration")), "bookkeeping columns are not metrics")
check([v for _, v, _ in history("time_total_s")] == [r["time_total_s"] for r in rows] and
      [v for _, v, _ in history("samples_per_s")] == [r["samples_per_s"] for r in rows], "the timing columns are MLflow metrics")


def flat(j, prefix=""):
    if isinstance(j, dict):
        for k, v in j.items():
            yield from flat(v, prefix + "." + k if prefix else k)
    elif isinstance(j, str):
        yield prefix, j
    elif j is None:
        yield prefix, "None"
    else:
        yield prefix, json.dumps(j, separators=(",", ":"))


expected = dict(flat(params))
got = {k: open(os.path.join(rdir, "params", k)).read() for k in walk("params")}
check(set(got) == set(expected), "one MLflow param per params.json field")
check(got.get("train_loop_config.model") == "mlp" and got.get("scaling.num_workers") == "2"
      and got.get("policies.tracker.name") == "mlflow", "param values")
tags = {k: open(os.path.join(rdir, "tags", k)).read() for k in walk("tags")}
check(tags.get("mlflow.source.type") == "LOCAL" and tags.get("dtrain.outcome") == "finished"
      and tags.get("dtrain.restarts") == "0" and "mlflow.user" in tags, "tags")
import pwd  # noqa: E402
user = os.environ.get("USER") or os.environ.get("LOGNAME") or pwd.getpwuid(os.getuid()).pw_name
check(tags.get("mlflow.user") == user and meta["user_id"] == user, "the user from $USER, $LOGNAME or getpwuid: %s" % user)
check({"report.html", "metrics.csv", "steps.jsonl", "params.json", "outcome.json", "checkpoints.json", "evaluations.json"}
      <= set(os.listdir(os.path.join(rdir, "artifacts"))), "artifacts: the run's files")

# --- report.html in Chromium -----------------------------------------------------------------------
report = os.path.join(run_dir, "report.html")
html = open(report).read()
check(not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html) and "<script" not in html,
      "report.html is self-contained: no external resource, no script")
if browser:
    from PIL import Image

    shot = os.path.join(workdir, "report.png")
    dom = render(report, shot, "1280,2000")
    if os.path.isfile(shot):
        img = Image.open(shot).convert("RGB")
        px = list(img.getdata())
        non_white = sum(1 for p in px if sum(p) < 720) / len(px)
        # The curves' stroke, #1f77b4, anti-aliased: blue well above red and green.
        blue = sum(1 for r, g, b in px if b > 150 and r < 90 and g < 150)
        check(img.size == (1280, 2000), "screenshot size %s" % (img.size,))
        check(non_white > 0.03, "the screenshot is not blank: %.1f%% non-white pixels" % (100 * non_white))
        check(blue > 500, "the curves are drawn: %d curve-blue pixels" % blue)
    check(dom.count('class="curve"') == 2, "DOM: %d SVG charts, the loss and the throughput" % dom.count('class="curve"'))
    check('data-metric="loss"' in dom and 'data-series="loss"' in dom and 'data-series="train_loss"' in dom,
          "DOM: the step history's loss and the reported train_loss on one chart")
    check(re.search(r'<polyline class="line"[^>]* data-series="train_loss" data-points="6" points="(\S+ ){6}"', dom)
          is not None, "DOM: the train_loss curve has its 6 points")
    check(re.search(r'<polyline class="line"[^>]* data-series="loss" data-points="12" points="(\S+ ){12}"', dom)
          is not None, "DOM: the step history's loss, every 10 steps, has 12 points")
    check('data-metric="test_accuracy"' not in dom and "<td>test_accuracy</td>" in dom,
          "DOM: test_accuracy, reported once, is a table row, not a chart")
    check('id="throughput-chart"' in dom, "DOM: the throughput chart")
    check('<table id="final-metrics">' in dom and "test_accuracy" in dom, "DOM: the final metrics table")
    m = re.search(r'<table class="confusion-matrix">(.*?)</table>', dom, re.S)
    check(m is not None and m.group(1).count("<td") == 100 and "Ankle boot" in m.group(1), "DOM: the 10x10 confusion matrix")
    check('id="outcome"' in dom and "finished" in dom, "DOM: the outcome")

finish()
