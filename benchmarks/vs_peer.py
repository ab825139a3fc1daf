#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""dtrain's example against the PyTorch DDP peer and against the machine's limit, in one run.

    benchmarks/vs_peer.py [--example build/examples/fashion_mnist] [--peer benchmarks/peers/fashion_mnist.py]
                          [--python tests/tools/venv-python] [--peer-mode eager|compile|both]
                          [--floor build/benchmarks/torch_floor] [--baseline OTHER_BUILD/examples/fashion_mnist]
                          [--steps 300] [--repeats 2] [--models cnn,mlp] [--workers 1,2] [--allow-load]

Each configuration (model x workers, global batch 128, --max-steps steps, one thread and one BLAS
thread per worker) runs, alternately and `repeats` times each:
  peer     the PyTorch DDP peer with N workers (benchmarks/peers/fashion_mnist.py, run by --python:
           the environment of scripts/python-env, torch 2.x), in eager mode, under torch.compile
           (its compilation counts in its loop), or both (--peer-mode both: each mode's figure is
           printed, and dtrain is set against the faster mode);
  dtrain   the example with N workers;
  limit    (N > 1) the example with 1 worker at the per-worker batch (128 / N), times N: what N
           workers would reach if distribution cost nothing (issue 15's limit);
  concurrent (N > 1) N independent examples with 1 worker at the per-worker batch, started
           together, their throughputs summed: what this machine gives N jobs that share its
           cores, caches and memory bandwidth but never communicate (the limit counts each worker
           as if it ran alone);
  single   (N > 1) the example as one process with N intra-op threads at batch 128: what a user
           would run instead of N workers on this machine;
  floor    (with --floor) benchmarks/torch_floor.cpp: a program that only loads LibTorch and adds
           two tensors (load_s), and the same program that then takes the model's first Adam step
           on a random batch of the per-worker size, one thread (first_step_s): the startup no
           LibTorch program can beat, without and with the model's own first step.
The table gives the median of each and the ratios. Peak RSS is that of the largest process of the
run (the driver or a worker; os.wait4's ru_maxrss, which covers the children each process waited for).
While dtrain's N-worker run trains, its processes' /proc/PID/smaps is read every second:
the line gives each process's peak PSS and RSS (the driver first), and the sums; PSS sum < RSS sum
by what the processes share (LibTorch's code, and the dataset: forked copy-on-write or mapped from
the cache), and the dataset's own mapping (the *.idx cache files) by its PSS and RSS.
Each run records the other processes' share of the machine (benchmarks/idle.py): the script waits
for a quiet machine first, and exits 3 after printing when a run was loaded (--allow-load: marked).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import idle
import timed_build

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--example", type=timed_build.program,
               default=os.path.join(here, "..", "build", "examples", "fashion_mnist"))
p.add_argument("--peer", default=os.path.join(here, "peers", "fashion_mnist.py"),
               help="the Python peer (default benchmarks/peers/fashion_mnist.py)")
p.add_argument("--python", default=os.path.join(here, "..", "tests", "tools", "venv-python"),
               help="the Python that runs the peer (default tests/tools/venv-python: scripts/python-env's)")
p.add_argument("--peer-mode", choices=["eager", "compile", "both"], default="eager",
               help="run the peer in eager mode, under torch.compile (--compile), or both")
p.add_argument("--floor", type=timed_build.program,
               help="the torch_floor program (benchmarks/torch_floor.cpp), for the startup floor")
p.add_argument("--steps", type=int, default=300)
p.add_argument("--repeats", type=int, default=2)
p.add_argument("--models", default="cnn,mlp")
p.add_argument("--workers", default="1,2")
p.add_argument("--baseline", type=timed_build.program,
               help="another build of the example (e.g. the previous main's), run alternately "
                    "with --example: its throughput ratio shows a regression beside the noise")
idle.add_argument(p)
args = p.parse_args()
if args.steps < 1 or args.repeats < 1:
    sys.exit("vs_peer.py: --steps and --repeats must be at least 1")
for path in [args.example] + [x for x in (args.floor, args.baseline) if x]:
    if not os.path.exists(path):
        sys.exit("vs_peer.py: %s does not exist; build it first (cmake --build build --target bench_vs_peer)" % path)
if not os.path.isfile(args.peer):
    sys.exit("vs_peer.py: --peer %s does not exist" % args.peer)
if not os.access(args.python, os.X_OK):
    sys.exit("vs_peer.py: --python %s is not a program (scripts/python-env makes the default)" % args.python)

env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
GLOBAL_BATCH = 128
PEER_MODES = ["eager", "compile"] if args.peer_mode == "both" else [args.peer_mode]


def tree(pid):
    """pid and its descendants, parents first."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        try:
            with open("/proc/%d/task/%d/children" % (p, p)) as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def memory_of(pid):
    """(PSS, RSS) of pid in MB, and (PSS, RSS) of its mappings of the dataset cache (*.idx)."""
    total, data = [0.0, 0.0], [0.0, 0.0]
    with open("/proc/%d/smaps" % pid) as f:
        in_data = False
        for line in f:
            field = line.split()
            if not field[0].endswith(":"):  # a mapping's header line: address range ... path
                in_data = field[-1].endswith(".idx")
            elif field[0] in ("Pss:", "Rss:"):
                i = 0 if field[0] == "Pss:" else 1
                total[i] += int(field[1]) / 1024.0
                if in_data:
                    data[i] += int(field[1]) / 1024.0
    return total, data


def sample_memory(pid, peaks, stop):
    """Keeps each process's peak (PSS, RSS, dataset PSS, dataset RSS) of pid's tree until stop is set."""
    while not stop.wait(1.0):  # smaps costs a few ms a process: rarely
        for p in tree(pid):
            try:
                (pss, rss), (dpss, drss) = memory_of(p)
            except (OSError, IndexError, ValueError):
                continue
            old = peaks.get(p, (0, 0, 0, 0))
            peaks[p] = tuple(max(a, b) for a, b in zip(old, (pss, rss, dpss, drss)))


loads = []


def run(cmd, threads=1, memory=False, measure=True):
    """Runs cmd, returns its last stdout line as JSON with peak_rss_tree_mb added (and, with
    memory, "processes": each process's peak (PSS, RSS, dataset PSS, dataset RSS) in MB), and
    the other processes' share of the machine meanwhile (unless `measure` is off: the caller
    measures runs that overlap)."""
    if measure:
        with idle.Run() as load:
            result = run(cmd, threads, memory, measure=False)
        loads.append(load.record)
        return result
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True,
                                env=dict(env, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads)))
        peaks, stop = {}, threading.Event()
        sampler = threading.Thread(target=sample_memory, args=(proc.pid, peaks, stop)) if memory else None
        if sampler:
            sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        if sampler:
            stop.set()
            sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        text = out.read()
        if proc.returncode != 0:
            sys.exit("failed (exit %d): %s\n%s%s" % (proc.returncode, " ".join(cmd), text, err.read()))
    result = json.loads(text.strip().splitlines()[-1])
    result["peak_rss_tree_mb"] = usage.ru_maxrss / 1024.0
    if memory:
        result["processes"] = [peaks[p] for p in sorted(peaks)]  # the driver's pid is the lowest
    return result


names = iter(range(1_000_000))


def dtrain_run(example, model, workers, batch, threads=1, memory=False, measure=True):
    # A name of its own per run: a run directory that exists would be resumed, not trained again.
    return run([example, "--model", model, "--workers", str(workers), "--global-batch", str(batch),
                "--max-steps", str(args.steps), "--threads-per-worker", str(threads),
                "--storage-path", "/tmp/dtrain_bench", "--name", "bench_%d_%d" % (os.getpid(), next(names))],
               threads, memory, measure)


def concurrent_run(example, model, workers, batch):
    """`workers` single-worker runs at `batch`, started together; their summed throughput."""
    with idle.Run() as load, ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda _: dtrain_run(example, model, 1, batch, measure=False), range(workers)))
    loads.append(load.record)
    return {"train_samples_per_s": sum(r["train_samples_per_s"] for r in results)}


def median(runs, key):
    return statistics.median(r[key] for r in runs)


throughput = {}
idle.wait(args.allow_load)
for model in args.models.split(","):
    for workers in [int(w) for w in args.workers.split(",")]:
        runs = {k: [] for k in ("dtrain", "limit", "concurrent", "single", "floor", "baseline")}
        peer_runs = {mode: [] for mode in PEER_MODES}
        for _ in range(args.repeats):
            for mode in PEER_MODES:
                peer_runs[mode].append(run([args.python, args.peer, "--model", model, "--workers", str(workers),
                                            "--global-batch", str(GLOBAL_BATCH), "--max-steps", str(args.steps),
                                            "--threads-per-worker", "1"] + (["--compile"] if mode == "compile" else [])))
            runs["dtrain"].append(dtrain_run(args.example, model, workers, GLOBAL_BATCH, memory=True))
            if workers > 1:
                runs["limit"].append(dtrain_run(args.example, model, 1, GLOBAL_BATCH // workers))
                runs["concurrent"].append(concurrent_run(args.example, model, workers, GLOBAL_BATCH // workers))
                runs["single"].append(dtrain_run(args.example, model, 1, GLOBAL_BATCH, threads=workers))
            if args.floor:
                runs["floor"].append(run([args.floor, "--model", model, "--batch", str(GLOBAL_BATCH // workers)]))
            if args.baseline:
                runs["baseline"].append(dtrain_run(args.baseline, model, workers, GLOBAL_BATCH))
        # The peer's figures are those of its faster mode (by median throughput).
        by_mode = {mode: median(rs, "train_samples_per_s") for mode, rs in peer_runs.items()}
        fastest = max(by_mode, key=by_mode.get)
        runs["peer"] = peer_runs[fastest]
        ours, peer = median(runs["dtrain"], "train_samples_per_s"), by_mode[fastest]
        throughput[(model, workers)] = (peer, ours)
        line = "%-4s %d worker(s): samples/s dtrain %8.0f | peer %8.0f %s (x%.2f)" % (
            model, workers, ours, peer, fastest, ours / peer)
        if len(by_mode) > 1:
            line += " [peer %s]" % ", ".join("%s %.0f" % (mode, sps) for mode, sps in by_mode.items())
        if runs["limit"]:
            limit = workers * median(runs["limit"], "train_samples_per_s")
            concurrent = median(runs["concurrent"], "train_samples_per_s")
            single = median(runs["single"], "train_samples_per_s")
            line += " | limit %8.0f (%.3f of it) | concurrent %8.0f (%.3f of it) | single process %8.0f (x%.2f)" % (
                limit, ours / limit, concurrent, ours / concurrent, single, ours / single)
        line += " | startup_s dtrain %.2f peer %.2f" % (median(runs["dtrain"], "startup_s"),
                                                        median(runs["peer"], "startup_s"))
        if runs["floor"]:
            floor, first = median(runs["floor"], "load_s"), median(runs["floor"], "first_step_s")
            started = median(runs["dtrain"], "startup_s")
            line += " floor %.2f (dtrain +%.2f), with the first step %.2f (dtrain +%.2f)" % (
                floor, started - floor, first, started - first)
        line += " | peak RSS MB dtrain %.0f peer %.0f" % (median(runs["dtrain"], "peak_rss_tree_mb"),
                                                          median(runs["peer"], "peak_rss_tree_mb"))
        # Each process's peak PSS/RSS, from the dtrain run of median throughput.
        mid = sorted(runs["dtrain"], key=lambda r: r["train_samples_per_s"])[len(runs["dtrain"]) // 2]
        procs = mid.get("processes", [])
        if procs:
            line += " | PSS/RSS MB %s; sum %.0f/%.0f, dataset mapping %.0f/%.0f" % (
                " ".join("%.0f/%.0f" % (p[0], p[1]) for p in procs), sum(p[0] for p in procs),
                sum(p[1] for p in procs), sum(p[2] for p in procs), sum(p[3] for p in procs))
        if runs["baseline"]:
            base = median(runs["baseline"], "train_samples_per_s")
            line += " | baseline %8.0f (x%.3f)" % (base, ours / base)
        print(line, flush=True)

print()
for model in args.models.split(","):
    if (model, 1) in throughput and (model, 2) in throughput:
        one, two = throughput[(model, 1)], throughput[(model, 2)]
        print("%-4s scaling 1 -> 2 workers: peer x%.2f, dtrain x%.2f" % (model, two[0] / one[0], two[1] / one[1]))
idle.refuse(idle.verdict(loads), args.allow_load)
