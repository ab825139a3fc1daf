#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 33's intruder: run on a third host while a dtrain run goes on (tests/multihost/intruders.sh).

  intruder.py --store HOST:PORT [--gloo-ports FILE] [--secret S] --until FILE --report FILE

Until FILE exists, again and again, at the run's store: garbage; well-formed requests (set and
delete of the group's keys) without the run secret's proof; a flood of idle connections; a
connection that stalls mid-handshake. With --secret (an insider: a process that has the secret but
is not a rank), it proves the secret and then sets and deletes keys and stalls mid-request instead.
Every port listed in --gloo-ports (host:port per line, the listeners that the harness saw on the
ranks' hosts, as a port scan finds them) it tries to connect to, and holds what connects. The
report: one line per kind of attack with its count, and "gloo-connected N of M".
"""
import argparse
import hashlib
import hmac
import os
import socket
import struct
import time

OP_SET, OP_ERASE = 1, 7
HELLO = 8 + 1 + 32  # "DTRSTOR1", flags, nonce


def frame(body):
    return struct.pack("<I", len(body)) + body


def field(b):
    return struct.pack("<I", len(b)) + b


def request(op, *fields):
    return frame(bytes([op]) + b"".join(field(f) for f in fields))


def recv_exactly(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def reply(s):
    (n,) = struct.unpack("<I", recv_exactly(s, 4))
    return recv_exactly(s, n)


def connect(addr, timeout=2.0):
    s = socket.create_connection(addr, timeout=timeout)
    s.settimeout(timeout)
    return s


def handshake(s, secret):
    hello = recv_exactly(s, HELLO)
    nonce = hello[9:]
    proof = hmac.new(secret.encode(), b"dtrain-store-auth" + nonce, hashlib.sha256).digest() if secret else bytes(32)
    s.sendall(proof)
    return s.recv(1)


# Keys as a dtrain run names them (launch/heartbeat.hpp, backend/gloo.hpp under the attempt's prefix).
# Not the stop key (launch/stop.hpp): setting it is how a holder of the secret (the driver, a rank
# that got a signal) asks the run to stop, so a run that saw the forged key stopped as asked, with
# other parameters than the undisturbed run's (1 run in CI under 2.15).
KEYS = [b"dtrain/0/beat/1", b"dtrain/0/progress/1", b"gloo/0/1", b"gloo/hosts/1", b"0/gloo/0/1"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True)
    p.add_argument("--gloo-ports")
    p.add_argument("--secret")
    p.add_argument("--until", required=True)
    p.add_argument("--report", required=True)
    a = p.parse_args()
    host, port = a.store.rsplit(":", 1)
    store = (host, int(port))
    counts = {}
    held = []
    tried, connected = set(), 0

    def count(kind):
        counts[kind] = counts.get(kind, 0) + 1

    n = 0
    while not os.path.exists(a.until):
        kind = n % 4
        n += 1
        try:
            if a.secret:  # an insider: proven, then misbehaving
                s = connect(store)
                if handshake(s, a.secret) != b"K":
                    count("insider-refused")
                    continue
                if kind == 0:
                    for k in KEYS:
                        s.sendall(request(OP_SET, k, b"forged"))
                        reply(s)
                        s.sendall(request(OP_ERASE, k))
                        reply(s)
                    count("insider-set-erase")
                elif kind == 1:
                    s.sendall(request(OP_SET, b"x", b"y")[:7])  # half a request, then silence
                    held.append(s)
                    count("insider-stall")
                else:
                    held.append(s)
                    count("insider-idle")
            elif kind == 0:
                s = connect(store)
                s.sendall(b"\x5a" * 1000)
                held.append(s)
                count("garbage")
            elif kind == 1:
                s = connect(store)
                recv_exactly(s, HELLO)
                # No proof (zeros), and the requests at once, not waiting for the verdict.
                count("unproven-requests")
                s.sendall(bytes(32) + b"".join(request(OP_SET, k, b"forged") + request(OP_ERASE, k) for k in KEYS))
                held.append(s)
            elif kind == 2:
                for _ in range(50):
                    held.append(connect(store))
                count("flood")
            else:
                s = connect(store)
                s.sendall(b"abc")
                held.append(s)
                count("stall")
        except OSError:
            count("store-not-reached-or-closed")
        if a.gloo_ports and os.path.exists(a.gloo_ports):
            with open(a.gloo_ports) as f:
                ports = {line.strip() for line in f if line.strip()}
            for target in sorted(ports - tried):
                tried.add(target)
                h, pt = target.rsplit(":", 1)
                try:
                    s = connect((h, int(pt)), timeout=1.5)
                    s.sendall(b"\x00" * 64)
                    held.append(s)
                    connected += 1
                except OSError:
                    pass
        if len(held) > 500:
            for s in held:
                s.close()
            held.clear()
        time.sleep(0.02)
    with open(a.report, "w") as f:
        for kind, c in sorted(counts.items()):
            f.write(f"{kind} {c}\n")
        f.write(f"gloo-connected {connected} of {len(tried)}\n")


if __name__ == "__main__":
    main()
