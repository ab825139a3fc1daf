#!/usr/bin/env python3
"""dtrain's GPU path against the same training loop in Python torch, side by side (GPU machine only).

    benchmarks/gpu_vs_torch.py [--train-gpu build/tests/gpu/train_gpu] [--precisions fp16,bf16,fp32]
                               [--workers 1] [--steps 300] [--warmup 30] [--batch 256] [--repeats 3]

Both sides train the Fashion-MNIST CNN (conv32-conv64-fc128-fc10) with SGD (lr 0.05, momentum 0.9) on
a synthetic Fashion-MNIST-shaped set of 60 000 images, one process per GPU, NCCL, DDP with
PyTorch's default buckets, `batch` samples per GPU per step. Python torch: DistributedDataParallel,
torch.autocast + torch.amp.GradScaler (fp16), batches gathered on the CPU, pinned and copied with
non_blocking=True. dtrain: tests/gpu/train_gpu.cpp (backend::nccl, strategy::ddp<>, amp<...>,
ctx.shard()'s prefetcher). Each configuration runs both alternately `repeats` times; the table
gives the median steps/s of each and their ratio. Timing starts after `warmup` steps, with the
device synchronised at both ends.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))


def torch_worker(rank, a, out):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("nccl", rank=rank, world_size=a.workers)
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    g = torch.Generator().manual_seed(99)
    data = torch.rand(60000, 1, 28, 28, generator=g)
    target = torch.randint(0, 10, (60000,), generator=g)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)).to(dev)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.precision)
    scaler = torch.amp.GradScaler("cuda", enabled=a.precision == "fp16")
    order = torch.randperm(60000, generator=g)
    per_rank = order[rank::a.workers]
    step, t0 = 0, time.perf_counter()
    while step < a.warmup + a.steps:
        for b in range(0, len(per_rank) - a.batch + 1, a.batch):
            if step == a.warmup:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            if step == a.warmup + a.steps:
                break
            idx = per_rank[b:b + a.batch]
            x = data.index_select(0, idx).pin_memory().to(dev, non_blocking=True)
            y = target.index_select(0, idx).pin_memory().to(dev, non_blocking=True)
            opt.zero_grad()
            with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            step += 1
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"impl": "torch", "precision": a.precision, "steps_per_s": a.steps / seconds,
                       "samples_per_s": a.steps * a.batch * a.workers / seconds, "loss": loss.item(),
                       "torch": torch.__version__}, f)
    dist.destroy_process_group()


def run_torch(a):
    import tempfile
    import torch.multiprocessing as mp
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        os.environ["MASTER_PORT"] = str(29500 + os.getpid() % 1000)
        mp.spawn(torch_worker, args=(a, f.name), nprocs=a.workers)
        return json.load(open(f.name))


def run_dtrain(a):
    cmd = [a.train_gpu, "--precision", a.precision, "--workers", str(a.workers), "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--batch", str(a.batch)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads([l for l in out.splitlines() if l.startswith("{")][-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-gpu", default=os.path.join(here, "..", "build", "tests", "gpu", "train_gpu"))
    p.add_argument("--precisions", default="fp16,bf16,fp32")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    rows = []
    for precision in args.precisions.split(","):
        a = argparse.Namespace(**vars(args), precision=precision)
        ours, theirs = [], []
        for _ in range(args.repeats):
            theirs.append(run_torch(a))
            ours.append(run_dtrain(a))
        d = statistics.median(r["steps_per_s"] for r in ours)
        t = statistics.median(r["steps_per_s"] for r in theirs)
        rows.append((precision, d, t, ours[-1]["loss"], theirs[-1]["loss"]))
        print(json.dumps({"precision": precision, "dtrain_steps_per_s": d, "torch_steps_per_s": t,
                          "ratio": d / t, "dtrain_runs": ours, "torch_runs": theirs}), flush=True)
    print(f"\n{'precision':<10}{'dtrain steps/s':>16}{'torch steps/s':>16}{'dtrain/torch':>14}"
          f"{'dtrain loss':>13}{'torch loss':>12}")
    for precision, d, t, dl, tl in rows:
        print(f"{precision:<10}{d:>16.1f}{t:>16.1f}{d / t:>14.2f}{dl:>13.3f}{tl:>12.3f}")
    print(f"(workers {args.workers}, batch {args.batch} per GPU, {args.steps} timed steps after {args.warmup}, "
          f"median of {args.repeats})")


if __name__ == "__main__":
    sys.exit(main())
