#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The PyTorch DDP peer's worker, run as one torchrun worker.

    torchrun ... --no_python /usr/bin/python3 benchmarks/peer_under_torchrun.py PEER [peer flags]

torch_ddp_peer.py reads no launcher variable: it spawns its own workers with
torch.multiprocessing.spawn and points them at 127.0.0.1. To run it across hosts the way dtrain runs
there, this loads the peer and calls its own worker(rank, ...) once, with torchrun's RANK and
WORLD_SIZE, and its init_process_group rendezvous at torchrun's MASTER_ADDR:MASTER_PORT (env://):
the same training loop, model, sampler and timing. Rank 0 prints the peer's JSON line.
GLOO_SOCKET_IFNAME must name the interface that reaches the other hosts (the peer defaults to lo).
"""
import time

_START = time.time()

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

if len(sys.argv) < 2:
    sys.exit(__doc__)
spec = importlib.util.spec_from_file_location("torch_ddp_peer", sys.argv[1])
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)

p = argparse.ArgumentParser()
p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
p.add_argument("--threads-per-worker", type=int, default=1)
p.add_argument("--global-batch", type=int, default=128)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--max-steps", type=int, default=None)
p.add_argument("--data-dir", default=peer.DATA_DIR_DEFAULT)
args = p.parse_args(sys.argv[2:])
try:
    rank, args.workers = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    launcher = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT")}
except KeyError as missing:
    sys.exit(f"peer_under_torchrun.py: {missing} is not set; run it under torchrun")

# The peer's worker sets MASTER_ADDR=127.0.0.1 and its own port: give init_process_group torchrun's.
init = peer.dist.init_process_group


def init_at_launcher(backend, rank, world_size):
    os.environ.update(launcher)
    init(backend, rank=rank, world_size=world_size)


peer.dist.init_process_group = init_at_launcher


class Printer:  # the peer's result queue: rank 0 puts its JSON there
    def put(self, result):
        result["wall_s"] = round(time.time() - _START, 3)
        print(json.dumps(result), flush=True)


peer.worker(rank, args, 0, _START, Printer())
