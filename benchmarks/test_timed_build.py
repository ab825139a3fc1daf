#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/timed_build.py, the guard against timing a test build's -O1 programs: a program under
a build directory configured with DTRAIN_TEST_BUILD=ON is refused with the commands that make one to
time, others are taken; every script that times a program of a build takes it through the guard.
Run by ctest (benchmarks.timed_build_guard) with this build's fashion_mnist and DTRAIN_TEST_BUILD.

    test_timed_build.py <a program of this build> <ON|OFF: this build's DTRAIN_TEST_BUILD>
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import timed_build  # noqa: E402

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def refusal(path):
    try:
        timed_build.program(path)
        return None
    except argparse.ArgumentTypeError as e:
        return str(e)


program, test_build = sys.argv[1], sys.argv[2].upper() in ("ON", "1", "TRUE", "YES", "Y")

with tempfile.TemporaryDirectory() as tmp:
    for name, cache in (("test", "DTRAIN_TEST_BUILD:BOOL=ON\n"), ("timed", "DTRAIN_TEST_BUILD:BOOL=OFF\n"),
                        ("older", "CMAKE_BUILD_TYPE:STRING=Release\n")):
        os.makedirs(os.path.join(tmp, name, "examples"))
        with open(os.path.join(tmp, name, "CMakeCache.txt"), "w") as f:
            f.write("# a CMake cache\n" + cache)
    why = refusal(os.path.join(tmp, "test", "examples", "fashion_mnist"))
    check(why is not None and "DTRAIN_TEST_BUILD=ON" in why and
          "cmake -DDTRAIN_TEST_BUILD=OFF" in why and "--target fashion_mnist" in why,
          "a program of a DTRAIN_TEST_BUILD=ON build is refused, naming the commands to rebuild it: %s" % why)
    check(refusal(os.path.join(tmp, "timed", "examples", "fashion_mnist")) is None,
          "a program of a DTRAIN_TEST_BUILD=OFF build is taken")
    check(refusal(os.path.join(tmp, "older", "examples", "fashion_mnist")) is None,
          "a program of a build that predates the option is taken")
    check(refusal(os.path.join(tmp, "fashion_mnist")) is None, "a program outside any build directory is taken")

# This build's own program, through a real script: refused before anything runs, exit code 2 (argparse).
if test_build:
    r = subprocess.run([sys.executable, os.path.join(here, "vs_peer.py"), "--example", program],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    check(r.returncode == 2 and "DTRAIN_TEST_BUILD=ON" in r.stdout and "cmake -DDTRAIN_TEST_BUILD=OFF" in r.stdout,
          "vs_peer.py refuses this test build's %s (exit %d): %s" % (program, r.returncode, r.stdout.strip()[-300:]))
else:
    check(refusal(program) is None, "this build's %s is taken: DTRAIN_TEST_BUILD is OFF" % program)

# Every script whose default program lies in a build directory takes its programs through the guard.
for script in sorted(glob.glob(os.path.join(here, "*.py"))):
    text = open(script).read()
    for m in re.finditer(r'p\.add_argument\("(--\w+)",(.*?)\)\n', text, re.S):
        if re.search(r'"build",\s*"(examples|benchmarks)"', m.group(2)):
            check("type=timed_build.program" in m.group(2),
                  "%s %s takes its program through timed_build.program" % (os.path.basename(script), m.group(1)))

if failures:
    print("FAIL %d check(s)" % len(failures))
    sys.exit(1)
print("ok: benchmarks/timed_build.py refuses test builds' programs and every benchmark script uses it")
