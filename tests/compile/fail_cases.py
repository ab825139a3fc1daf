#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The compile-fail cases of tests/compile/fail, compiled as one unit and checked one by one:

    fail_cases.py build LOG -- BUILD COMMAND...
    fail_cases.py check LOG CASE EXPECTED COMPILER

`build` runs the build command of the unit that holds every case (each in a namespace of its own,
tests/compile/CMakeLists.txt) and writes what the compiler said to LOG. It passes when the build
failed with compiler errors: a unit of mistakes that compiles is a failure of every case.

`check` passes when one of the log's errors is a static_assert whose message matches EXPECTED (a
regular expression) and that the compiler attributes to CASE (fail/<name>.cpp). COMPILER is CMake's
compiler id, for where a compiler puts an error's context: GCC (GNU) in the lines just above the
error, back to the note, error or source excerpt before them ("fail/<name>.cpp:11:7: required from
here"); Clang in the notes below it, up to the next error ("... requested here"). A static_assert in
the case itself is located there. An error with the right message that another case caused, or the
case's own errors without it (a typo, a missing include, a cascade), do not pass.
"""
import pathlib
import re
import subprocess
import sys

ERROR = re.compile(r":\d+(:\d+)?: (fatal )?error: ")
# What ends GCC's context above an error: another diagnostic, or the source excerpt under one.
DIAGNOSTIC_OR_EXCERPT = re.compile(r": (fatal )?(error|warning|note): |^\s+\d* \|")


def build(log, command):
    log.unlink(missing_ok=True)
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace")
    log.write_text(done.stdout)
    errors = sum(1 for line in done.stdout.splitlines() if ERROR.search(line))
    if done.returncode == 0:
        print(done.stdout)
        print(f"fail_cases: the unit of compile-fail cases compiled; every case in it must be "
              f"rejected (see {log})")
        return 1
    if errors == 0:
        print(done.stdout)
        print(f"fail_cases: the build failed without a compiler error (exit {done.returncode})")
        return 1
    print(f"fail_cases: the compiler rejected the unit with {errors} errors; the log is {log}")
    return 0


def check(log, case, expected, compiler):
    if not log.exists():
        print(f"fail_cases: no log at {log}: run the test compile.fail_cases first (ctest runs it "
              f"as this test's fixture)")
        return 1
    lines = log.read_text(errors="replace").splitlines()
    errors = [i for i, line in enumerate(lines) if ERROR.search(line)]
    message = re.compile(r"static.assert(ion)? failed.*" + expected)
    located = re.compile(r"(^|[\s/])" + re.escape(case) + r":\d+")
    own, elsewhere = [], []
    for k, i in enumerate(errors):
        if compiler == "Clang":
            block = lines[i:errors[k + 1] if k + 1 < len(errors) else len(lines)]
        else:
            first = i
            while first > 0 and not DIAGNOSTIC_OR_EXCERPT.search(lines[first - 1]):
                first -= 1
            block = lines[first:i + 1]
        if not any(located.search(line) for line in block):
            if message.search(lines[i]):
                elsewhere.append(lines[i])
            continue
        if message.search(lines[i]):
            print("\n".join(block))
            print(f"fail_cases: {case} is rejected with the expected message")
            return 0
        own.append(lines[i])
    print(f"fail_cases: no static_assert matching '{expected}' is attributed to {case}")
    if own:
        print("its errors:\n  " + "\n  ".join(own))
    else:
        print("the compiler attributes no error to it: it compiled")
    if elsewhere:
        print("the message comes from another case:\n  " + "\n  ".join(elsewhere))
    return 1


def main(argv):
    if len(argv) >= 4 and argv[1] == "build" and argv[3] == "--":
        return build(pathlib.Path(argv[2]), argv[4:])
    if len(argv) == 6 and argv[1] == "check":
        return check(pathlib.Path(argv[2]), argv[3], argv[4], argv[5])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
