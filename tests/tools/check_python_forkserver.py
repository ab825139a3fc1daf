#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tests/tools/venv-python with DTRAIN_PYTHON_FORKSERVER=1 runs a script as the interpreter would.

    check_python_forkserver.py VENV_PYTHON WORK_DIR

Through python_forkserver.py, a script must see its arguments, working directory, environment and
standard streams; its exit status, its uncaught exception and a signal sent to the caller must come
out as with plain Python; a caller killed with SIGKILL takes its child along; another value of an
import setting (OMP_NUM_THREADS) gets a server of its own, and what plain Python gets from it. And
the run must come from the server: torch is imported before the script's first line. PYTHONUNBUFFERED
writes through to a pipe; a server that cannot come up is started once, and the runs are plain.
Prints OK, or FAIL lines and exits 1.
"""
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

venv_python, work = sys.argv[1], Path(sys.argv[2])
work.mkdir(parents=True, exist_ok=True)
(work / "lib").mkdir(exist_ok=True)
(work / "lib" / "neighbour.py").write_text("VALUE = 42\n")
script = work / "lib" / "script.py"
script.write_text("""\
import os, sys, time
preloaded = "torch" in sys.modules
import neighbour
print("preloaded", preloaded, "argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("CHECK_VALUE"),
      "neighbour", neighbour.VALUE, "name", __name__, "file", __file__, "stdin", sys.stdin.read().strip())
print("to stderr", file=sys.stderr)
what = sys.argv[1] if len(sys.argv) > 1 else ""
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "raise":
    raise ValueError("the script's own error")
if what == "threads":
    import torch
    print("threads", torch.get_num_threads())
if what == "sleep":
    open(sys.argv[2], "w").write(str(os.getpid()))
    time.sleep(300)
if what == "early":
    print("early")
    time.sleep(300)
""")
# A private TMPDIR: the servers of this check, not the suite's.
env = dict(os.environ, DTRAIN_PYTHON_FORKSERVER="1", TMPDIR=str(work), OMP_NUM_THREADS="1",
           CHECK_VALUE="seen")
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAIL " + what, flush=True)


def run(*args, stdin="", **extra):
    return subprocess.run([venv_python, *args], input=stdin, capture_output=True, text=True, cwd=work,
                          env=dict(env, **extra), timeout=180)


first = run(str(script), "a", "b c", stdin="from stdin")
check(first.returncode == 0, "a plain run exited %d: %s" % (first.returncode, first.stderr))
expected = ("preloaded True argv ['a', 'b c'] cwd %s env seen neighbour 42 name __main__ file %s "
            "stdin from stdin" % (work, script))
check(first.stdout.strip() == expected, "the script saw\n  %s\nnot\n  %s" % (first.stdout.strip(), expected))
check(first.stderr == "to stderr\n", "stderr was %r" % first.stderr)

# A TMPDIR too long for a socket's address (107 bytes) still gets a server.
long_tmp = work / ("a_temporary_directory_whose_path_is_longer_than_a_unix_socket_address_holds" * 2)
long_tmp.mkdir(exist_ok=True)
long_run = run(str(script), TMPDIR=str(long_tmp))
check(long_run.stdout.startswith("preloaded True"), "with a long TMPDIR the script saw %r" % long_run.stdout)

status = run(str(script), "exit", "3")
check(status.returncode == 3, "sys.exit(3) gave exit status %d" % status.returncode)
error = run(str(script), "raise")
traceback_head = ["Traceback (most recent call last):", '  File "%s", line 11, in <module>' % script]
check(error.returncode == 1 and error.stderr.splitlines()[1:3] == traceback_head
      and error.stderr.rstrip().endswith("ValueError: the script's own error"),
      "an uncaught exception gave status %d and:\n%s" % (error.returncode, error.stderr))
code = run("-c", "import sys; print(sys.argv, 'torch' in sys.modules)", "x")
check(code.stdout == "['-c', 'x'] True\n", "-c printed %r" % code.stdout)
missing = run(str(work / "missing.py"))
check(missing.returncode == 2 and "can't open file" in missing.stderr,
      "a missing script gave status %d: %s" % (missing.returncode, missing.stderr))
# The thread count LibTorch reads from OMP_NUM_THREADS at import: what plain Python gets.
other = run(str(script), "threads", OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
plain = run(str(script), "threads", OMP_NUM_THREADS="2", MKL_NUM_THREADS="2", DTRAIN_PYTHON_FORKSERVER="0")
check(other.stdout.splitlines()[-1:] == plain.stdout.splitlines()[-1:] == ["threads 2"],
      "OMP_NUM_THREADS=2 gave %r, plain Python %r"
      % (other.stdout.splitlines()[-1:], plain.stdout.splitlines()[-1:]))

for number, expected_status in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
    pid_file = work / ("pid_%d" % number)
    caller = subprocess.Popen([venv_python, str(script), "sleep", str(pid_file)], cwd=work, env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    child = int(pid_file.read_text() or 0) if pid_file.exists() else 0
    check(child and child != caller.pid, "the sleeping script did not write its pid, or is the caller itself")
    caller.send_signal(number)
    check(caller.wait(timeout=30) == expected_status,
          "the caller ended with %d after signal %d, not %d" % (caller.returncode, number, expected_status))
    while child and Path("/proc/%d" % child).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    check(child and not Path("/proc/%d" % child).exists(),
          "the script outlived its caller (signal %d)" % number)

# PYTHONUNBUFFERED (python -u): a line reaches a pipe before the script ends. (Read from the pipe
# itself: a buffered reader may hold the second line where select() does not see it.)
caller = subprocess.Popen([venv_python, str(script), "early"], cwd=work, env=dict(env, PYTHONUNBUFFERED="1"),
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
output, deadline = b"", time.monotonic() + 60
while b"\nearly\n" not in output and time.monotonic() < deadline:
    ready, _, _ = select.select([caller.stdout], [], [], max(0.0, deadline - time.monotonic()))
    chunk = os.read(caller.stdout.fileno(), 65536) if ready else b""
    if not chunk:
        break
    output += chunk
caller.kill()
caller.wait()
seen = output.decode(errors="replace").splitlines()
check(seen[:1] and seen[0].startswith("preloaded True") and "early" in seen,
      "with PYTHONUNBUFFERED=1 the pipe got %r while the script ran" % seen)

# A server that cannot come up (here, an import that ends the process) is tried once: the runs are
# plain Python, and the next run does not start another server.
broken = work / "broken_import"
broken.mkdir(exist_ok=True)
(broken / "numpy.py").write_text("import sys\nsys.exit('numpy: this installation is broken')\n")
for marker in work.glob("dtrain-pyfork-*/*.refused"):
    marker.unlink()  # a run of this check minutes ago left one that still holds
refused = [run(str(script), PYTHONPATH=str(broken)) for _ in range(2)]
check(all(r.returncode == 0 and r.stdout.startswith("preloaded False") for r in refused),
      "beside a server that could not start, the runs gave %r"
      % [(r.returncode, r.stdout, r.stderr) for r in refused])
markers = set(work.glob("dtrain-pyfork-*/*.refused"))
check(len(markers) == 1 and all("this installation is broken" in m.read_text()
                                and not m.with_suffix(".log").exists() for m in markers),
      "the server that could not start left %r, or the second run started one again" % markers)

for socket_file in work.glob("dtrain-pyfork-*/*.sock"):
    socket_file.unlink()  # this check's servers leave within seconds of losing their path
# (Where the work directory's path is too long for a socket's address, they are under /tmp,
# apart from others by their TMPDIR, and leave after a minute idle.)
if failures:
    sys.exit(1)
print("OK: arguments, directory, environment, streams, exit status, exceptions and signals as plain Python")
