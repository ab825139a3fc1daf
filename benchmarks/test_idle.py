#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/idle.py, the load guard of every benchmark script: a process that is not the
benchmark's is counted as load, loaded runs are marked and refused, and every script takes
--allow-load. Run by ctest (benchmarks.idle_guard)."""
import os
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import idle  # noqa: E402

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


# A busy process that is not this one's waited-for child takes a whole core: at least 1/cores of
# the machine (0.5 on two cores), whatever else runs beside this test.
busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 30\nwhile time.time() < t: pass"])
try:
    time.sleep(0.3)
    with idle.Run() as r:
        time.sleep(1.5)
finally:
    busy.kill()
    busy.wait()
check(r.record["others_share"] >= 0.8 / idle.CORES,
      "a busy neighbour is others' load: %.2f of the machine (one core is %.2f)" % (r.record["others_share"], 1 / idle.CORES))
check(set(r.record) >= {"others_share", "others_cpu_s", "wall_s", "loadavg_before", "loadavg_after", "cores"},
      "a run's record has its fields")

# A waited-for child's CPU time is the benchmark's own, not others' load: it is subtracted from the
# machine's busy time (on a loaded machine the child gets less than its wall time, so compare with
# what it actually used).
busy0, kids0 = idle._busy_s(), idle.resource.getrusage(idle.resource.RUSAGE_CHILDREN)
with idle.Run() as own:
    subprocess.run([sys.executable, "-c", "import time\nt = time.time() + 1.5\nwhile time.time() < t: pass"])
busy1, kids1 = idle._busy_s(), idle.resource.getrusage(idle.resource.RUSAGE_CHILDREN)
child = (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime)
check(child > 0.1 and own.record["others_cpu_s"] <= (busy1 - busy0) - child + 0.1,
      "a waited-for child's %.2f s of CPU is not counted as others' (others %.2f s of %.2f s busy)"
      % (child, own.record["others_cpu_s"], busy1 - busy0))

quiet = {"others_share": 0.01, "loadavg_before": 0.1, "loadavg_after": 0.2}
loaded = {"others_share": 0.40, "loadavg_before": 3.0, "loadavg_after": 4.0}
check(idle.verdict([quiet, quiet])["idle"], "runs below the threshold are idle")
v = idle.verdict([quiet, loaded])
check(not v["idle"] and v["worst_others_share"] == 0.40, "one loaded run marks the figures loaded")
refused = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import idle; "
                          "idle.refuse({'idle': False}, False)" % here])
check(refused.returncode == 3, "loaded figures are refused with exit status 3")
allowed = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import idle; "
                          "idle.refuse({'idle': False}, True)" % here])
check(allowed.returncode == 0, "--allow-load keeps them")

for script in ("vs_peer.py", "vs_text_peer.py", "vs_image_peer.py", "vs_minilm_peer.py", "vs_vit_peer.py", "vs_llm_peer.py",
               "checkpoint_stall.py", "gpu_vs_torch.py"):
    out = subprocess.run([sys.executable, os.path.join(here, script), "--help"], capture_output=True, text=True)
    check(out.returncode == 0 and "--allow-load" in out.stdout, script + " takes --allow-load")

sys.exit(1 if failures else 0)
