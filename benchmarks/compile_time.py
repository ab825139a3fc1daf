#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""What a program that uses dtrain costs to compile, against the same work in plain LibTorch (issue 48).

    benchmarks/compile_time.py [--compilers g++,clang++-14] [--modes compiled,header-only]
                               [--units plain,torch,dtrain,quickstart,fashion_mnist,text_classifier,finetune_vit]
                               [--repeats 3] [--work DIR] [--json FILE] [--allow-load]

For each compiler and mode the script configures this checkout with CMake (Release, the examples,
the benchmarks; no compiler cache) in WORK/<compiler>-<mode>, takes each unit's compile command
from compile_commands.json, the project's own flags, and runs it `repeats` times. A unit's figures
are the medians of the compiler's CPU seconds (user + system, from wait4: the driver and cc1plus)
and of its peak resident memory. The units:

  plain          benchmarks/compile/plain_quickstart.cpp: the quickstart's work in plain LibTorch
  torch          benchmarks/compile/torch_include.cpp: #include <torch/torch.h>, an empty main
  dtrain         benchmarks/compile/dtrain_include.cpp: #include <dtrain/dtrain.hpp>, an empty main
  <example>      examples/<example>.cpp

The modes: `compiled` (-DDTRAIN_SEPARATE_COMPILATION=ON: the program compiles against
declarations and links libdtrain.a, which is built once and not timed) and `header-only`. The
ratios printed are a unit's CPU seconds over plain's (dtrain over torch's for `dtrain`). Each run
records the other processes' share of the machine (benchmarks/idle.py): the script waits for a
quiet machine first, and exits 3 after printing when a run was loaded (--allow-load: marked).
It exits 4 when a ratio is over its ceiling (CEILINGS: the quickstart at most 1.5x the plain
program compiled and 3.5x header-only, with g++).
"""
import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import idle

here = os.path.dirname(os.path.abspath(__file__))
source = os.path.normpath(os.path.join(here, ".."))
UNITS = {
    "plain": "benchmarks/compile/plain_quickstart.cpp",
    "torch": "benchmarks/compile/torch_include.cpp",
    "dtrain": "benchmarks/compile/dtrain_include.cpp",
}
REFERENCE = {"dtrain": "torch"}  # the unit each one is divided by; plain for the others
# The ceilings a change must not cross (exit 4 when one does): the quickstart's CPU seconds over the
# plain program's, with g++ (docs/benchmarks.md, "Compile time").
CEILINGS = {("g++", "compiled", "quickstart"): 1.5, ("g++", "header-only", "quickstart"): 3.5}

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--compilers", default="g++,clang++-14")
p.add_argument("--modes", default="compiled,header-only")
p.add_argument("--units", default="plain,torch,dtrain,quickstart,fashion_mnist,text_classifier,finetune_vit")
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--work", default="/tmp/dtrain-compile-time", help="where the build trees are configured")
p.add_argument("--json", help="also write the figures to this file")
idle.add_argument(p)
args = p.parse_args()


def configure(compiler, mode):
    build = os.path.join(args.work, f"{os.path.basename(compiler)}-{mode}")
    cc = compiler.replace("clang++", "clang").replace("g++", "gcc")
    cmd = ["cmake", "-S", source, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
           f"-DCMAKE_CXX_COMPILER={shutil.which(compiler) or compiler}", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
           f"-DDTRAIN_SEPARATE_COMPILATION={'ON' if mode == 'compiled' else 'OFF'}",
           "-DDTRAIN_BUILD_EXAMPLES=ON", "-DDTRAIN_BUILD_BENCHMARKS=ON", "-DDTRAIN_BUILD_TESTS=OFF",
           "-DDTRAIN_INSTALL=OFF", "-UCMAKE_CXX_COMPILER_LAUNCHER"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, CC=cc, CXX=compiler))
    if mode == "compiled":  # the library, once: what a user builds once, not per program
        subprocess.run(["cmake", "--build", build, "--target", "dtrain"], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(build, "compile_commands.json")) as f:
        commands = {os.path.normpath(e["file"]): e for e in json.load(f)}
    return build, commands


def unit_file(unit):
    return os.path.join(source, UNITS.get(unit, f"examples/{unit}.cpp"))


def compile_once(entry):
    """(CPU seconds, peak RSS in MiB) of one compile: the driver and the compiler it runs."""
    out = os.path.join(args.work, "unit.o")
    command = shlex.split(entry["command"])
    command[command.index("-o") + 1] = out
    proc = subprocess.Popen(command, cwd=entry["directory"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if status != 0:
        sys.exit(f"compile failed: {entry['file']}\n{err[-3000:]}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


idle.wait(args.allow_load)
results, loads = [], []
for compiler in args.compilers.split(","):
    for mode in args.modes.split(","):
        build, commands = configure(compiler, mode)
        row = {"compiler": compiler, "mode": mode, "units": {}}
        for unit in args.units.split(","):
            entry = commands.get(os.path.normpath(unit_file(unit)))
            if entry is None:
                print(f"  {compiler} {mode}: {unit} is not built here (no compile command); skipped", flush=True)
                continue
            cpu, rss = [], []
            for _ in range(args.repeats):
                with idle.Run() as load:
                    c, r = compile_once(entry)
                loads.append(load.record)
                cpu.append(c)
                rss.append(r)
            row["units"][unit] = {"cpu_s": statistics.median(cpu), "peak_rss_mib": statistics.median(rss),
                                  "runs_cpu_s": cpu, "runs_peak_rss_mib": rss}
            print(f"  {compiler} {mode}: {unit}: {statistics.median(cpu):.1f} CPU s, "
                  f"{statistics.median(rss):.0f} MiB (runs {', '.join(f'{c:.1f}' for c in cpu)})", flush=True)
        units = row["units"]
        for unit, figures in units.items():
            ref = REFERENCE.get(unit, "plain")
            if ref in units and unit != ref:
                figures["ratio"] = figures["cpu_s"] / units[ref]["cpu_s"]
                figures["ratio_to"] = ref
        results.append(row)

print()
print("| compiler | mode | unit | CPU s (median of %d) | peak RSS MiB | ratio |" % args.repeats)
print("| --- | --- | --- | --- | --- | --- |")
for row in results:
    for unit, f in row["units"].items():
        ratio = f"{f['ratio']:.2f}x {f['ratio_to']}" if "ratio" in f else "-"
        print(f"| {row['compiler']} | {row['mode']} | {unit} | {f['cpu_s']:.1f} | {f['peak_rss_mib']:.0f} | {ratio} |")
record = {"time": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "repeats": args.repeats, "results": results,
          "load": idle.verdict(loads)}
if args.json:
    with open(args.json, "w") as f:
        json.dump(record, f, indent=2)
over = [f"{compiler} {mode} {unit}: {units[unit]['ratio']:.2f}x {units[unit]['ratio_to']}, over its ceiling {ceiling}x"
        for row in results for (compiler, mode, unit), ceiling in CEILINGS.items()
        if os.path.basename(row["compiler"]) == compiler and row["mode"] == mode
        for units in [row["units"]] if unit in units and units[unit].get("ratio", 0) > ceiling]
for line in over:
    print(line, file=sys.stderr)
idle.refuse(record["load"], args.allow_load)
if over:
    sys.exit(4)
