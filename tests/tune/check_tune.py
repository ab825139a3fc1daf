#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Tuner experiments as a user runs them (tests/tune/scenarios.cpp):

    check_tune.py SCENARIOS WORKDIR VENV_PYTHON

- ASHA stops exactly the trials that Ray's algorithm, reimplemented here, stops, at the same
  iterations; the best trial is the one with the lowest last val_loss; trials.csv, results.json
  and report.html (rendered in Chromium) show every trial; MLflow's client finds one experiment
  with a run per trial;
- the concurrency limit holds and is reached;
- a failing trial fails alone;
- a Tuner killed with SIGKILL, or stopped with SIGTERM, continues when run again: finished trials
  are not run again, the unfinished one resumes from its checkpoint;
- an experiment asked to continue with another search is refused, naming what differs.
"""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tracking"))
from page_checks import check, finish, render  # noqa: E402

scenarios, workdir, venv_python = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(workdir, ignore_errors=True)
os.makedirs(workdir)


def run(name, scheduler, concurrent, *args, expect=0):
    p = subprocess.run([scenarios, workdir, name, scheduler, str(concurrent), *args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=600)
    sys.stderr.write(p.stderr[-4000:])
    if p.returncode != expect:
        sys.exit("FAIL %s %s exited with %d, not %d:\n%s" % (name, " ".join(args), p.returncode, expect, p.stdout))
    return p


def trials(out):
    rows = {}
    for line in out.splitlines():
        if line.startswith("TRIAL "):
            _, tid, status, early, iteration, loss, quality = line.split()
            rows[tid] = {"status": status, "early": early == "1", "iteration": int(iteration),
                         "loss": float(loss), "quality": float(quality)}
    return rows


def percentile(values, q):  # numpy's linear interpolation
    v = sorted(values)
    rank = q / 100 * (len(v) - 1)
    lo, hi = int(rank), min(int(rank) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def ray_asha(qualities, epochs, max_t=8, grace=1, rf=2):
    """Ray Tune's _Bracket.on_result, one bracket, trials one after another: the iteration each
    trial stops at, or None when it runs to the end of its epochs."""
    milestones, m = [], grace
    while m <= max_t:
        milestones.append(m)
        m *= rf
    rungs = [(m, {}) for m in reversed(milestones)]
    stops = []
    for trial, q in enumerate(qualities):
        stop = None
        for it in range(1, epochs + 1):
            score, action = -(q + 1.0 / it), "continue"
            for milestone, recorded in rungs:
                if it >= max_t:
                    action = "stop"
                if it < milestone or trial in recorded:
                    continue
                if recorded and score < percentile(list(recorded.values()), (1 - 1 / rf) * 100):
                    action = "stop"
                recorded[trial] = score
                break
            if action == "stop":
                stop = it
                break
        stops.append(stop)
    return stops


def experiment(name):
    return os.path.join(workdir, name)


# --- ASHA against Ray's algorithm ----------------------------------------------------------------
qualities = [0.4, 0.1, 0.3, 0.2, 0.05, 0.35, 0.15]
expected = ray_asha(qualities, 6)
check(any(expected) and not all(expected), "the scenario stops some trials and not others: %s" % expected)
out = run("asha", "asha", 1, "--quality", ",".join(map(str, qualities))).stdout
rows = trials(out)
check(len(rows) == len(qualities), "%d trials ran: %s" % (len(qualities), sorted(rows)))
for i, q in enumerate(qualities):
    r = rows.get("trial_%04d" % i, {})
    stop = expected[i]
    check(abs(r.get("quality", -1) - q) < 1e-12, "trial %d ran quality %s (grid order)" % (i, q))
    check(r.get("status") == "finished" and r.get("early") == (stop is not None) and
          r.get("iteration") == (stop or 6),
          "trial %d (quality %s): %s, Ray's ASHA %s" % (i, q, r, "stops at %d" % stop if stop else "runs to the end"))
best_loss = min(r["loss"] for r in rows.values())
best_id = [t for t, r in rows.items() if r["loss"] == best_loss][0]
check("BEST %s" % best_id in out, "best_result is the trial with the lowest last val_loss (%s)" % best_id)
exp = experiment("asha")
with open(os.path.join(exp, "trials.csv")) as f:
    table = list(csv.DictReader(f))
check(len(table) == len(qualities) and all("config/quality" in r and "best_val_loss" in r for r in table),
      "trials.csv: a row per trial with its config and best score")
results = json.load(open(os.path.join(exp, "results.json")))
check(results["best_trial"] == best_id and len(results["trials"]) == len(qualities), "results.json names the best trial")
spec = json.load(open(os.path.join(exp, "trial_0003", "trial.json")))
check(spec["index"] == 3 and "seed" in spec and spec["config"]["quality"] == 0.2 and "lr" in spec["config"] and
      "model.width" in spec["config"], "trial.json records the trial's index, seed and config: %s" % spec)
tuner = json.load(open(os.path.join(exp, "tuner.json")))
check(tuner["scheduler"] == {"name": "asha", "max_t": 8.0, "grace_period": 1.0, "reduction_factor": 2.0} and
      tuner["space"]["quality"] == {"grid": qualities}, "tuner.json records the search: %s" % tuner["scheduler"])
params = json.load(open(os.path.join(exp, "trial_0002", "params.json")))
check(params["train_loop_config"]["quality"] == 0.3 and params["train_loop_config"]["epochs"] == 6,
      "the trial's params carry its config: %s" % params["train_loop_config"])
dom = render(os.path.join(exp, "report.html"), os.path.join(workdir, "tune_report.png"), "1000,900")
check(dom.count('class="line"') == len(qualities), "report.html draws a curve per trial (%d)" % dom.count('class="line"'))
check(dom.count('class="trial"') == len(qualities), "report.html has a row per trial")
check(dom.count('class="legend"') == len(qualities), "the chart's legend names every trial (%d)" % dom.count('class="legend"'))
p = subprocess.run([scenarios, workdir, "launched", "fifo", "1"], env=dict(os.environ, RANK="0", WORLD_SIZE="1",
                   LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1"), stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True, timeout=120)
check(p.returncode == 1 and "runs under a launcher" in p.stderr, "a Tuner under torchrun is refused: %s" % p.stderr[-300:])
stopped = sum(1 for s in expected if s)
check(dom.count("(stopped early)") == stopped, "report.html marks the %d trials ASHA stopped" % stopped)
mlflow = subprocess.run([venv_python, "-c", """
import os, sys
os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
from mlflow.tracking import MlflowClient
c = MlflowClient(tracking_uri="file://" + sys.argv[1])
exps = [e for e in c.search_experiments() if e.name != "Default"]
runs = c.search_runs([e.experiment_id for e in exps])
print(len(exps), exps[0].name if exps else "", len(runs), sorted(r.info.run_name for r in runs)[0] if runs else "")
""", os.path.join(exp, "mlruns")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
check(mlflow.stdout.split() == ["1", "asha", str(len(qualities)), "trial_0000"],
      "MLflow's client: one experiment 'asha' with a run per trial: %r %s" % (mlflow.stdout, mlflow.stderr[-500:]))

# --- another search on the same experiment is refused ---------------------------------------------
p = run("asha", "fifo", 1, "--quality", ",".join(map(str, qualities)), expect=1)
check("was run with scheduler" in p.stderr and "Start::fresh" in p.stderr, "a changed search is refused, saying so")

# --- the concurrency limit ------------------------------------------------------------------------
run("concurrent", "fifo", 2, "--quality", "0.1,0.2,0.3,0.4,0.5", "--epochs", "3", "--sleep-ms", "300")
spans = []
for i in range(5):
    d = os.path.join(experiment("concurrent"), "trial_%04d" % i)
    start = float(open(os.path.join(d, "starts.txt")).read().split()[1])
    end = float(open(os.path.join(d, "ends.txt")).read().split()[0])
    spans.append((start, end))
most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
check(most == 2, "at most 2 trials ran at once, and 2 did: %d" % most)

# --- a failing trial fails alone --------------------------------------------------------------------
out = run("failing", "fifo", 2, "--quality", "0.1,0.2,0.3", "--fail-quality", "0.2").stdout
rows = trials(out)
check(rows["trial_0001"]["status"] == "failed" and rows["trial_0000"]["status"] == "finished" and
      rows["trial_0002"]["status"] == "finished", "the failing trial failed, the others finished: %s" % rows)
results = json.load(open(os.path.join(experiment("failing"), "results.json")))
check("deliberate failure" in (results["trials"][1]["error"] or ""), "its error is recorded: %s" % results["trials"][1]["error"])
check("BEST trial_0000" in out, "best_result passes over the failed trial")


# --- killed (SIGKILL) or stopped (SIGTERM), then run again ------------------------------------------
def rows_of(path):
    try:
        return sum(1 for _ in open(path))
    except FileNotFoundError:
        return 0


for name, sig in (("killed", signal.SIGKILL), ("stopped", signal.SIGTERM)):
    args = [scenarios, workdir, name, "fifo", "1", "--quality", "0.1,0.2,0.3", "--epochs", "5", "--sleep-ms", "400"]
    tuner = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = "trial_0001" if sig == signal.SIGKILL else "trial_0000"
    deadline = time.time() + 180
    while rows_of(os.path.join(experiment(name), victim, "metrics.jsonl")) < 2 and time.time() < deadline:
        time.sleep(0.05)
    tuner.send_signal(sig)
    out, err = tuner.communicate(timeout=120)
    check(tuner.returncode == (-9 if sig == signal.SIGKILL else 2), "%s: the Tuner ended (%d)" % (name, tuner.returncode))
    # The trial's process got SIGTERM (from the kernel when its Tuner died): it records its stop.
    deadline = time.time() + 60
    outcome = {}
    while time.time() < deadline:
        try:
            outcome = json.load(open(os.path.join(experiment(name), victim, "outcome.json")))
        except (FileNotFoundError, ValueError):
            pass
        if outcome.get("status") in ("stopped", "finished", "failed"):
            break
        time.sleep(0.1)
    check(outcome.get("status") == "stopped", "%s: %s recorded its stop: %s" % (name, victim, outcome.get("status")))
    before = {t: rows_of(os.path.join(experiment(name), t, "metrics.jsonl")) for t in ("trial_0000", "trial_0001")}
    out = run(name, "fifo", 1, "--quality", "0.1,0.2,0.3", "--epochs", "5", "--sleep-ms", "400").stdout
    rows = trials(out)
    last_epochs = [json.loads(open(os.path.join(experiment(name), t, "metrics.jsonl")).readlines()[-1])["epoch"]
                   for t in sorted(rows)]
    # The stopped trial reported (and checkpointed) where its stop cut its epoch short: it reports
    # that epoch again when it completes it.
    check(len(rows) == 3 and all(r["status"] == "finished" for r in rows.values()) and last_epochs == [4, 4, 4] and
          all(r["iteration"] == 5 for t, r in rows.items() if t != victim) and rows[victim]["iteration"] >= 5,
          "%s: run again, every trial finished its 5 epochs: %s" % (name, rows))
    for t in ("trial_0000", "trial_0001", "trial_0002"):
        starts = [line.split() for line in open(os.path.join(experiment(name), t, "starts.txt"))]
        if t == victim:
            check(len(starts) == 2 and int(starts[1][0]) >= 1,
                  "%s: %s resumed from its checkpoint (iterations resumed from: %s)" % (name, t, [s[0] for s in starts]))
        else:
            check(len(starts) == 1, "%s: %s ran once, not again (%d starts)" % (name, t, len(starts)))
    if sig == signal.SIGKILL:
        check(before["trial_0000"] == 5 and rows_of(os.path.join(experiment(name), "trial_0000", "metrics.jsonl")) == 5,
              "killed: the finished trial's history is untouched")

finish()
