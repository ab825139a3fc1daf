#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs the tests' Python scripts in processes forked from one that has imported torch already.

    python_forkserver.py run SCRIPT.py [ARGS...] | -c CODE [ARGS...] | -m MODULE [ARGS...]

The Python references (tests/unit/*_reference.py, the examples' checks, tests/data/check_*.py) each
spent about 5 of their 6 CPU seconds importing torch, transformers and their kin, and a suite starts
about sixty of them, in each of the test command's two g++ configurations. tests/tools/venv-python
hands a run here when DTRAIN_PYTHON_FORKSERVER=1 (tests/environment.cmake sets it for ctest): the
first run starts a server that imports those modules once, and every run is a child forked from it
that takes the caller's arguments, working directory, environment and standard streams (passed over
a Unix socket), and whose exit status becomes the caller's. A signal to the caller goes to the
child; a caller that dies takes its child with it. The server leaves after a minute without work.

Servers are per user (a 0700 directory, and each connection's peer must be that user) and per
environment of what the imports read (the variables in IMPORT_ENVIRONMENT), so a run never gets
modules imported under other settings. Anything this cannot do (another interpreter flag, a server
that does not come up, one with threads to fork) runs the script as plain Python would, unchanged;
after a server that could not serve, the runs are plain for ten minutes without trying again.
"""
import array
import hashlib
import io
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time

PRELOAD = ("numpy", "torch", "torchvision", "safetensors.torch", "tokenizers", "transformers",
           "transformers.modeling_utils", "peft", "PIL.Image")
IMPORT_ENVIRONMENT = ("PYTHON", "LD_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "TORCH", "PYTORCH", "CUDA",
                      "NCCL", "HF_", "TRANSFORMERS", "TOKENIZERS", "SAFETENSORS", "PEFT", "TMPDIR")
IDLE_SECONDS = 60
REFUSED_SECONDS = 600
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                     signal.SIGUSR2)


def socket_path():
    """The socket of the server for this interpreter and this environment of the imports."""
    key = hashlib.sha256(os.path.realpath(sys.executable).encode())
    for name in sorted(os.environ):
        if name.startswith(IMPORT_ENVIRONMENT):
            key.update(b"\0%s=%s" % (name.encode(), os.environ[name].encode()))
    name = "dtrain-pyfork-%d/%s.sock" % (os.getuid(), key.hexdigest()[:16])
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), name)
    if len(path.encode()) + len(".new") > 107:  # what a Unix socket's address holds: /tmp's then
        path = os.path.join("/tmp", name)
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.lstat(directory)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise OSError("%s is not a directory of this user's alone" % directory)
    return path


def send_message(conn, obj, fds=()):
    data = json.dumps(obj).encode()
    data = struct.pack("!I", len(data)) + data
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sent = conn.sendmsg([data], ancillary)
    conn.sendall(data[sent:])


def receive_message(conn, with_fds=False):
    header, fds = b"", []
    while len(header) < 4:
        chunk, ancillary, _, _ = conn.recvmsg(4 - len(header), socket.CMSG_SPACE(3 * 4) if with_fds else 0)
        if not chunk:
            return None, fds
        header += chunk
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += array.array("i", payload[: len(payload) - len(payload) % 4]).tolist()
    size, data = struct.unpack("!I", header)[0], b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None, fds
        data += chunk
    return json.loads(data), fds


# --- the caller's side ---------------------------------------------------------------------------
def run_plainly(args):
    os.execv(sys.executable, [sys.executable] + args)


def connect(path):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        return conn
    except OSError:
        conn.close()
        return None


def start_server(path):
    """Connects to the server at path, starting one if there is none (one caller at a time starts).

    A server that ended without serving leaves its log as path.refused, and for REFUSED_SECONDS
    after that the runs are plain rather than each paying for the imports again."""
    import fcntl
    import subprocess
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = connect(path)
        if conn:
            return conn
        try:
            if time.time() - os.path.getmtime(path + ".refused") < REFUSED_SECONDS:
                return None
        except OSError:
            pass
        server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", path],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=open(path + ".log", "w"), start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            conn = connect(path)
            if conn:
                return conn
            time.sleep(0.05)
        if server.poll() is not None:
            os.replace(path + ".log", path + ".refused")
        return None


def run(args):
    # A script that is not there gets the interpreter's own message and exit status.
    forkable = args and (args[0] in ("-c", "-m") and len(args) > 1 or os.path.isfile(args[0]))
    try:
        path = socket_path() if forkable else None
        conn = path and (connect(path) or start_server(path))
    except OSError:
        conn = None
    if not conn:
        run_plainly(args)
    request = {"args": args, "cwd": os.getcwd(), "env": dict(os.environ)}
    try:
        send_message(conn, request, fds=(0, 1, 2))
        started, _ = receive_message(conn)
    except OSError:
        started = None
    if not started:  # the server went away before it forked: nothing has run yet
        conn.close()
        run_plainly(args)
    for number in FORWARDED_SIGNALS:
        signal.signal(number, lambda number, _: conn.sendall(bytes([number])))
    finished, _ = receive_message(conn)  # a forwarded signal interrupts it; Python resumes it (PEP 475)
    if finished is None:
        sys.stderr.write("python_forkserver: the server went away while %s ran\n" % args[0])
        os._exit(1)
    status = finished["status"]
    if os.WIFSIGNALED(status):  # the caller ends as the child did
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status))


# --- the server ----------------------------------------------------------------------------------
def output_stream(fd, line_buffering, unbuffered, errors):
    binary = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
    return io.TextIOWrapper(binary, errors=errors, line_buffering=line_buffering,
                            write_through=unbuffered)


def child(request, fds, listener, connections):
    """In the forked process: becomes the caller's Python run of its script. Never returns."""
    code, script = 1, None
    try:
        os.setpgid(0, 0)
        listener.close()
        for conn in connections:
            conn.close()
        for number in range(1, signal.NSIG):
            if number in (signal.SIGKILL, signal.SIGSTOP):
                continue
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it at start
        signal.set_wakeup_fd(-1)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # The streams as the interpreter opens them: PYTHONUNBUFFERED (python -u) writes through.
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = output_stream(1, os.isatty(1), unbuffered, "strict")
        sys.stderr = output_stream(2, True, unbuffered, "backslashreplace")
        import random
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        args = request["args"]
        import runpy
        if args[0] == "-c":
            sys.argv = ["-c"] + args[2:]
            sys.path[0] = ""
            import types
            main = sys.modules["__main__"] = types.ModuleType("__main__")  # this module's globals stay
            script = "<string>"
            exec(compile(args[1], script, "exec"), main.__dict__)
        elif args[0] == "-m":
            sys.argv = [args[1]] + args[2:]
            sys.path[0] = request["cwd"]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = args
            script = os.path.abspath(args[0])  # __file__ as the interpreter sets it
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            code = exit.code or 0
        else:
            print(exit.code, file=sys.stderr)
    except BaseException as error:
        import traceback
        tb = error.__traceback__  # from the script's first frame on, as the interpreter prints it
        while tb and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        traceback.print_exception(type(error), error, tb or error.__traceback__)
        code = 130 if isinstance(error, KeyboardInterrupt) else 1
    try:
        import atexit
        import threading
        threading._shutdown()  # waits for the script's non-daemon threads, as the interpreter does
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


def serve(path):
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    import gc
    gc.collect()
    gc.freeze()  # the children's collections leave the imports' objects alone (and their pages shared)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # forking then could copy a lock some other thread holds
        sys.exit("python_forkserver: the imports started %d threads; not serving" % threads)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    temporary = path + ".new"  # one server starts at a time (start_server's lock)
    if os.path.exists(temporary):
        os.unlink(temporary)
    listener.bind(temporary)
    listener.listen(64)
    os.rename(temporary, path)  # callers connect only to a listening server
    inode = os.stat(path).st_ino

    def path_is_ours():  # another server may have taken the path
        return os.path.exists(path) and os.stat(path).st_ino == inode
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wakeup_read, selectors.EVENT_READ, "reap")
    children = {}  # pid -> the caller's connection; the selector's data for it is the pid
    last_work = time.monotonic()
    while (children or time.monotonic() - last_work < IDLE_SECONDS) and path_is_ours():
        for key, _ in selector.select(timeout=5):
            if key.data == "accept":
                conn, _ = listener.accept()
                uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                request, fds = receive_message(conn, with_fds=True)
                if uid != os.getuid() or request is None or len(fds) != 3:
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    child(request, fds, listener, list(children.values()))
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
                send_message(conn, {"pid": pid})
            elif key.data == "reap":
                os.read(wakeup_read, 4096)
            else:  # a caller's connection: a signal to forward, or the caller is gone
                conn, pid = key.fileobj, key.data
                data = conn.recv(64)
                try:
                    if data:
                        for number in data:
                            os.kill(pid, number)
                    else:
                        selector.unregister(conn)
                        os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid)
            if conn in selector.get_map():
                selector.unregister(conn)
            try:
                send_message(conn, {"status": status})
            except OSError:
                pass
            conn.close()
            last_work = time.monotonic()
    if path_is_ours():
        os.unlink(path)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) >= 2 and sys.argv[1] == "run":
        run(sys.argv[2:])
    else:
        sys.exit(__doc__)
