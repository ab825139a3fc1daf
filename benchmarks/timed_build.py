# SPDX-License-Identifier: Apache-2.0
"""The programs a benchmark times come from a build made to be timed: the test command's builds
(scripts/build, scripts/test-libtorch2) set DTRAIN_TEST_BUILD, which compiles the library and the
programs at -O1 to build the suite faster, and a ratio taken with them would not be dtrain's.

    import timed_build
    p.add_argument("--example", type=timed_build.program, default=...)

program() finds the CMake build directory that holds the program (the nearest CMakeCache.txt
above it) and refuses one configured with DTRAIN_TEST_BUILD=ON, naming the commands that turn it
off and rebuild. A program outside any CMake build directory (installed, copied) is taken as is.
"""
import argparse
import os


def build_dir_of(path):
    """The nearest directory above path that holds a CMakeCache.txt, or None."""
    d = os.path.dirname(os.path.abspath(path))
    while True:
        if os.path.isfile(os.path.join(d, "CMakeCache.txt")):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def is_test_build(build_dir):
    with open(os.path.join(build_dir, "CMakeCache.txt"), errors="replace") as f:
        for line in f:
            if line.startswith("DTRAIN_TEST_BUILD:"):
                return line.split("=", 1)[1].strip().upper() in ("ON", "1", "TRUE", "YES", "Y")
    return False


def program(path):
    """argparse type for a dtrain program to time: the path, or an error that says how to make one."""
    build = build_dir_of(path)
    if build is not None and is_test_build(build):
        rel = os.path.relpath(build)
        rel = build if rel.startswith("..") else rel
        raise argparse.ArgumentTypeError(
            "%s comes from a test build (%s was configured with DTRAIN_TEST_BUILD=ON, as the test command "
            "configures it: everything at -O1), not one to time. Turn it off and rebuild first: "
            "cmake -DDTRAIN_TEST_BUILD=OFF %s && cmake --build %s --target %s"
            % (path, rel, rel, rel, os.path.basename(path)))
    return path
