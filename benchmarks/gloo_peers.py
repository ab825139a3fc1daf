#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""What restricting Gloo's listeners to the group's hosts costs (issue 33), across two hosts.

    benchmarks/gloo_peers.py [--scenarios build/tests/multirank/scenarios] [--floats 262144]
                             [--steps 200] [--repeats 5]

On two network namespace hosts (scripts/netns-hosts, as the multihost tests make them; needs root),
rank 0 on one and rank 1 on the other, a bare 2-rank Gloo group (the scenarios program's
gloo_group), alternately (each first in turn) made as c10d makes it (unguarded) and as backend::gloo makes it (guarded:
the ranks exchange their hosts' addresses through the store, and every listener of the group gets
a socket filter that the kernel runs on each packet it receives). Per run, rank 0's figures: the
milliseconds from making the group to its first allreduce's end (the rendezvous part), and the
milliseconds per allreduce of --floats floats over TCP between the hosts (the per-step part: every
packet of the pair's connection passes the filter). Prints the medians and the ratios.
"""
import argparse
import json
import os
import re
import secrets
import statistics
import subprocess
import sys

import idle

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--scenarios", default=os.path.join(root, "build", "tests", "multirank", "scenarios"))
p.add_argument("--floats", type=int, default=262144)
p.add_argument("--steps", type=int, default=200)
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)  # inside the namespace hosts
idle.add_argument(p)
args = p.parse_args()
if not os.path.exists(args.scenarios):
    sys.exit("gloo_peers.py: %s does not exist; build it first (cmake --build build --target dtrain_scenarios)"
             % args.scenarios)
if min(args.repeats, args.steps, args.floats) < 1:
    sys.exit("gloo_peers.py: --repeats, --steps and --floats must be at least 1")

if not args.inner:
    cmd = [os.path.join(root, "scripts", "netns-hosts"), "--hosts", "2", "--", sys.executable, os.path.abspath(__file__),
           "--inner"] + sys.argv[1:]
    status = subprocess.call(cmd)
    if status == 77:
        sys.exit("gloo_peers.py: network namespaces cannot be made here (run it as root)")
    sys.exit(status)


def one(variant, port):
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR=os.environ["DTRAIN_HOST_0"], MASTER_PORT=str(port),
               DTRAIN_RUN_SECRET=secrets.token_hex(16))
    ranks = [subprocess.Popen([os.path.join(root, "scripts", "netns-hosts"), "on", str(r), "--", args.scenarios,
                               "gloo_group", "--variant", variant, "--rendezvous-ms", "0", "--steps", str(args.steps),
                               "--batch", str(args.floats)],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    out = [r.communicate(timeout=300)[0] for r in ranks]
    m = re.search(r"RESULT sum=3 connect_ms=([0-9.e+-]+) allreduce_ms=([0-9.e+-]+)", out[0])
    if any(r.returncode for r in ranks) or not m:
        sys.exit("gloo_peers.py: the %s run failed:\n%s" % (variant, "\n".join(out)))
    return float(m.group(1)), float(m.group(2))


idle.wait(args.allow_load)
runs = {"unguarded": [], "guarded": []}
records = []
port = 29700
for repeat in range(args.repeats):
    for variant in ("unguarded", "guarded")[:: 1 if repeat % 2 == 0 else -1]:  # each first in turn
        port += 1
        with idle.Run() as load:
            connect_ms, allreduce_ms = one(variant, port)
        runs[variant].append((connect_ms, allreduce_ms))
        records.append(load.record)
        print("%-9s connect %.1f ms, allreduce of %d floats %.3f ms" % (variant, connect_ms, args.floats, allreduce_ms),
              flush=True)

median = {v: tuple(statistics.median(x[i] for x in r) for i in range(2)) for v, r in runs.items()}
result = {
    "floats": args.floats, "steps": args.steps, "repeats": args.repeats,
    "median_connect_ms": {v: m[0] for v, m in median.items()},
    "median_allreduce_ms": {v: m[1] for v, m in median.items()},
    "guarded_over_unguarded": {"connect": median["guarded"][0] / median["unguarded"][0],
                               "allreduce": median["guarded"][1] / median["unguarded"][1]},
    "load": idle.verdict(records),
}
print(json.dumps(result, indent=1))
idle.refuse(result["load"], args.allow_load)
