#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Runs a command that ends by printing one JSON line, and checks fields of that line.

    check_json_line.py 'test_accuracy>=0.85' 'workers==2' -- prog arg ...
"""
import json
import re
import subprocess
import sys

split = sys.argv.index("--")
checks, command = sys.argv[1:split], sys.argv[split + 1:]
proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
sys.stderr.write(proc.stderr)
print(proc.stdout, end="")
if proc.returncode != 0:
    sys.exit("command exited with status %d" % proc.returncode)
line = json.loads(proc.stdout.strip().splitlines()[-1])
failed = False
for check in checks:
    key, op, want = re.fullmatch(r"([a-z_]+)(>=|<=|==)(.+)", check).groups()
    if key not in line:
        print("missing key %r" % key)
        failed = True
        continue
    got = line[key]
    ok = {"<=": lambda: got <= float(want), ">=": lambda: got >= float(want),
          "==": lambda: str(got) == want}[op]()
    print("%s %s: %s %s %s" % ("ok  " if ok else "FAIL", key, got, op, want))
    failed = failed or not ok
sys.exit(1 if failed else 0)
