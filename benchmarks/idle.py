# SPDX-License-Identifier: Apache-2.0
"""Benchmarks that cannot be fooled by load: every benchmark script measures, around each run, how
much CPU time processes other than its own took, and refuses or loudly marks figures taken on a
busy machine.

Why a measure of its own and not the load average alone: the load average is a decaying mean over
a minute (it still reads 1.5 a minute after a build stops, and 0.3 a minute after it starts), and it
counts the benchmark's own processes. What spoils a comparison is other work while the two sides
run, and the two sides do not slow down alike under it (issue 29: the text transformer measured
2.53x at load average 8-12 and 1.06x idle). So each run records:
  others_share  CPU time of every process that is not the benchmark or its children, over the
                run's wall time times the cores (from /proc/stat's busy time, less this process's
                and its waited-for children's CPU time, from getrusage);
  loadavg       the 1-minute load average before and after.
THRESHOLD (5 % of the machine) is about what an idle machine of this kind shows (0.2-2 %: the
shell, the kernel's threads, an editor) and a quarter of what one extra busy thread takes on two
cores (50 %): a run above it had a neighbour that could move a ratio by more than the 3-5 %
spread of idle repeats.

    import idle
    idle.wait(args.allow_load)              # before the first run: waits up to 60 s for quiet
    with idle.Run() as r:                   # around each run
        ...
    record["load"] = r.record
    record["load"] = idle.verdict(records)  # after: marks, and prints a banner when loaded
    idle.refuse(record["load"], args.allow_load)   # once written: exit 3 when loaded
"""
import os
import resource
import sys
import time

THRESHOLD = 0.05
CORES = os.cpu_count() or 1


def _busy_s():
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle_ticks = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle_ticks) / os.sysconf("SC_CLK_TCK")


def _ours_s():
    """CPU seconds of this process and its waited-for children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class Run:
    """Measures the other processes' share of the machine while the `with` block runs. Children must
    have been waited for when the block ends (subprocess.run does), or their time counts as others'."""

    def __enter__(self):
        self.load_before = os.getloadavg()[0]
        self.t0, self.busy0, self.ours0 = time.monotonic(), _busy_s(), _ours_s()
        return self

    def __exit__(self, *exc):
        wall = time.monotonic() - self.t0
        others = max(0.0, (_busy_s() - self.busy0) - (_ours_s() - self.ours0))
        self.record = {"others_share": others / (wall * CORES) if wall > 0 else 0.0, "others_cpu_s": others,
                       "wall_s": wall, "loadavg_before": self.load_before, "loadavg_after": os.getloadavg()[0],
                       "cores": CORES}
        return False


def sample(seconds=1.0):
    """The other processes' share of the machine over `seconds` of this process sleeping."""
    with Run() as r:
        time.sleep(seconds)
    return r.record["others_share"]


def wait(allow_load, patience_s=60):
    """Before the first run: waits until the machine is quiet (others below THRESHOLD over a
    second), up to `patience_s`; then exits 3 naming what it saw, unless `allow_load`."""
    deadline = time.monotonic() + patience_s
    while True:
        share = sample()
        if share <= THRESHOLD:
            return share
        if time.monotonic() > deadline:
            message = ("the machine is busy: other processes took %.0f %% of its %d cores (load average %.2f); "
                       "figures taken now cannot be compared with idle ones" % (100 * share, CORES, os.getloadavg()[0]))
            if allow_load:
                print("WARNING: " + message + " (--allow-load: going on; the figures are marked loaded)", flush=True)
                return share
            sys.exit("benchmark refused: %s. Stop the other work, or pass --allow-load to take loaded figures "
                     "(marked as such)" % message)
        time.sleep(2)


def verdict(records):
    """After the runs: {'idle': bool, 'worst_others_share': x, ...} for the JSON, and a loud banner when
    a run was loaded. Then refuse(result, allow_load), once the figures are written."""
    worst = max((r["others_share"] for r in records), default=0.0)
    result = {"idle": worst <= THRESHOLD, "worst_others_share": worst, "threshold": THRESHOLD, "cores": CORES,
              "loadavg": [min(r["loadavg_before"] for r in records), max(r["loadavg_after"] for r in records)]
              if records else []}
    if result["idle"]:
        print("load: idle (other processes took at most %.1f %% of the machine during a run; threshold %.0f %%)"
              % (100 * worst, 100 * THRESHOLD), flush=True)
    else:
        print("\n" + "!" * 100 + "\nLOADED: other processes took up to %.0f %% of the machine during a run "
              "(threshold %.0f %%): these figures are not valid as targets; run again on an idle machine\n"
              % (100 * worst, 100 * THRESHOLD) + "!" * 100, flush=True)
    return result


def refuse(result, allow_load):
    """Exits 3 when the runs were loaded, unless `allow_load`."""
    if not result["idle"] and not allow_load:
        sys.exit(3)


def add_argument(parser):
    parser.add_argument("--allow-load", action="store_true",
                        help="run even when other processes load the machine (the figures are marked loaded)")
