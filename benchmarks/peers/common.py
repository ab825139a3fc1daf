# SPDX-License-Identifier: Apache-2.0
"""What the three Python peers share: their common flags, the worker processes (spawned, one
Gloo process group over 127.0.0.1; or one worker of a launcher's group, torchrun's across hosts),
the timed training loop and the ONE JSON line they print.

Import this module before anything imports torch: it sets OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS from --threads-per-worker (1 unless given) when they are not set already, so
that a BLAS library that starts its own threads starts as many as torch's intra-op pool has.

Timing, in every peer (wall clock, time.time()):
  startup_s            the peer's start (its first line, in the parent process) -> the first
                       optimizer step done on rank 0
  train_loop_s         a barrier just before the first batch -> a barrier just after the last
                       step: loading and collating batches, forward, backward, allreduce and the
                       optimizer; not process start, data preparation nor evaluation
  train_samples_per_s  samples trained, summed over the workers, / train_loop_s
  wall_s               the peer's start -> every worker joined, its result in hand
With --compile the model runs under torch.compile; its compilation happens in the first steps
and so counts in startup_s and train_loop_s, as it would in a user's run.
"""
import os
import sys


def _threads_flag(argv):
    for i, arg in enumerate(argv):
        if arg == "--threads-per-worker" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--threads-per-worker="):
            return arg.split("=", 1)[1]
    return "1"


for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, _threads_flag(sys.argv))

import argparse  # noqa: E402  (after the thread variables, on purpose)
import json  # noqa: E402
import math  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402


class UserError(Exception):
    """A problem with what the user gave (a missing file, a malformed dataset): reported in one
    line, without a traceback."""


def fail(prog, message):
    sys.exit("%s: %s" % (prog, message))


def parser(doc, workers, global_batch):
    """The flags every peer takes, with this peer's defaults for --workers and --global-batch."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=workers, help="worker processes (default %(default)s)")
    p.add_argument("--threads-per-worker", type=int, default=1, help="intra-op and BLAS threads of each worker")
    p.add_argument("--global-batch", type=int, default=global_batch,
                   help="samples per step over all workers (default %(default)s)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps in all (0: no limit)")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed of every worker (default 0)")
    p.add_argument("--compile", action="store_true", help="train the model under torch.compile")
    return p


def check(p, args):
    """Refuses flags that make no sense, through the parser (a usage line, exit status 2)."""
    for name in ("workers", "threads_per_worker", "global_batch", "epochs"):
        if getattr(args, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if args.max_steps < 0:
        p.error("--max-steps must be 0 (no limit) or more")
    if args.compile and not hasattr(torch, "compile"):
        p.error("--compile needs torch 2.x; this is torch %s" % torch.__version__)
    if args.global_batch % args.workers:
        p.error("--global-batch (%d) must be divisible by --workers (%d)" % (args.global_batch, args.workers))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, worker, args, port, queue, extra):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the hostname may resolve to another device
    _work(rank, worker, args, queue, extra)


def _work(rank, worker, args, queue, extra):
    torch.set_num_threads(args.threads_per_worker)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    try:
        result = worker(rank, args, *extra)
        if rank == 0:
            queue.put(result)
    except UserError as e:
        print("%s: %s" % (os.path.basename(sys.argv[0]), e), file=sys.stderr, flush=True)
        os._exit(2)  # no traceback; the other ranks stop with this one
    # Every rank leaves the group together: one that tore its connections down while rank 0 still
    # evaluated alone made rank 0's Gloo abort ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


class _Rank0:  # under a launcher, rank 0's result stays in its process
    result = None

    def put(self, result):
        self.result = result


def run(worker, args, start, extra=()):
    """Runs worker(rank, args, *extra) in args.workers spawned processes, each in the process group,
    and returns rank 0's result (a dict) with wall_s (from `start`), torch's version and the mode
    (eager or compile, unless the result names its own) added. Under a launcher (torchrun, or
    anything that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), this process is one worker
    of the launcher's group, across hosts too (GLOO_SOCKET_IFNAME names the interface that reaches
    the others); rank 0 returns the result, the other ranks None."""
    prog = os.path.basename(sys.argv[0])
    if "RANK" in os.environ:
        missing = [v for v in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            fail(prog, "RANK is set but %s is not: run it under torchrun, or unset RANK" % ", ".join(missing))
        if int(os.environ["WORLD_SIZE"]) != args.workers:
            fail(prog, "--workers %d, but the launcher started %s workers (WORLD_SIZE): give --workers %s"
                 % (args.workers, os.environ["WORLD_SIZE"], os.environ["WORLD_SIZE"]))
        rank0 = _Rank0()
        _work(int(os.environ["RANK"]), worker, args, rank0, tuple(extra))
        if int(os.environ["RANK"]) != 0:
            return None
        result = rank0.result
    else:
        queue = mp.get_context("spawn").SimpleQueue()
        try:
            mp.spawn(_entry, args=(worker, args, _free_port(), queue, tuple(extra)), nprocs=args.workers, join=True)
        except mp.ProcessExitedException as e:
            fail(prog, "a worker stopped (exit status %s)" % e.exit_code)
        except mp.ProcessRaisedException as e:
            fail(prog, "a worker failed:\n%s" % e)
        result = queue.get()
    result.setdefault("mode", "compile" if args.compile else "eager")
    result["torch"] = torch.__version__
    result["wall_s"] = round(time.time() - start, 3)
    return result


def distribute(model, compile_it):
    """The model DDP trains and the plain module it wraps, which rank 0 evaluates alone (DDP's
    forward would wait for the other ranks). With compile_it DDP wraps torch.compile(model): the
    model's forward and backward are compiled, and DDP's gradient hooks allreduce as in eager mode
    (torch.compile of the DDP wrapper compiled nothing with torch 2.15: its forward breaks the
    graph in DDP's logger, and the frames it calls are torch's own, which Dynamo skips)."""
    return DistributedDataParallel(torch.compile(model) if compile_it else model), model


class Loop:
    """The timed training loop: `step(batch)` computes a batch's loss and returns (loss, samples)."""

    def __init__(self, start, recent=50):
        self.start, self.recent_n = start, recent
        self.steps = self.samples = 0
        self.first_step = None
        self.last_loss = float("nan")
        self.recent = []  # the last `recent` losses of this rank
        self.loop_s = 0.0

    def train(self, args, optimizer, loader, sampler, step, after_epoch=None):
        dist.barrier()
        t0 = time.time()
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for batch in loader:
                optimizer.zero_grad(set_to_none=True)
                loss, n = step(batch)
                loss.backward()
                optimizer.step()
                self._record(loss.item(), n)
                if args.max_steps and self.steps >= args.max_steps:
                    break
            if after_epoch:
                after_epoch()
            if args.max_steps and self.steps >= args.max_steps:
                break
        dist.barrier()
        self.loop_s = time.time() - t0

    def _record(self, loss, n):
        if self.first_step is None:
            self.first_step = time.time()
        self.steps += 1
        self.samples += n
        self.last_loss = loss
        self.recent = (self.recent + [loss])[-self.recent_n:]

    def totals(self):
        """Over all ranks: (samples trained, mean of the ranks' last losses, mean of the recent losses)."""
        t = torch.tensor([float(self.samples), self.last_loss, sum(self.recent), float(len(self.recent))],
                         dtype=torch.float64)
        dist.all_reduce(t)
        world = dist.get_world_size()
        recent = t[2].item() / t[3].item() if t[3].item() > 0 else float("nan")
        return int(t[0].item()), t[1].item() / world, recent

    def timing(self, samples):
        """The timing keys of the JSON line (startup_s is None if no step ran)."""
        return {"steps": self.steps, "train_samples": samples, "train_loop_s": round(self.loop_s, 3),
                "train_samples_per_s": round(samples / self.loop_s, 1) if self.loop_s > 0 else 0.0,
                "startup_s": round(self.first_step - self.start, 3) if self.first_step else None}


def emit(result):
    """Prints the ONE JSON line (sorted keys); a NaN or infinite loss is printed as null. Nothing
    for None (a rank other than 0 under a launcher)."""
    if result is None:
        return
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in result.items()}
    print(json.dumps(clean, sort_keys=True), flush=True)
