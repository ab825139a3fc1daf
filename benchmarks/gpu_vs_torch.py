#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""dtrain's GPU path against the same training loop in Python torch, side by side (GPU machine only).

    benchmarks/gpu_vs_torch.py [--train-gpu build-gpu/tests/gpu/train_gpu]
        [--configs cnn:fp16,cnn:bf16,cnn:fp32,transformer:bf16] [--workers 1] [--repeats 3]
        [--cnn-steps 300] [--cnn-batch 256] [--tf-steps 50] [--tf-batch 16] [--warmup 20]
        [--d-model 2048] [--heads 16] [--seq 1024] [--vocab 8192] [--json FILE]
        [--profile DIR] [--profile-steps 5] [--profile-configs transformer:bf16]

Two models, both trained with SGD (lr 0.05, momentum 0.9), one process per GPU, NCCL, DDP with
PyTorch's default buckets, `batch` samples per GPU per step:
  cnn          the Fashion-MNIST CNN (conv32-conv64-fc128-fc10) on 60 000 synthetic 1x28x28 images
  transformer  one pre-norm transformer block as a language model (token and position embeddings,
               multi-head attention through scaled_dot_product_attention, a 4x GELU MLP, a
               vocabulary head) on 4096 random token sequences, next-token cross-entropy
Python torch: DistributedDataParallel, torch.autocast (+ torch.amp.GradScaler for fp16), batches
gathered on the CPU, pinned and copied with non_blocking=True. With one worker, also Python's
fastest single-process loop: no DDP wrapper and SGD(fused=True) ("torch fused" below). dtrain:
tests/gpu/train_gpu.cpp (backend::nccl, strategy::ddp<>, amp<...>, ctx.shard()'s prefetcher, ctx.step's
fused SGD), the same model and loop; with one worker also "dtrain graph": the same loop with its step
captured in a CUDA graph (ctx.graphed_step, `train_gpu --graph 1`).

--profile DIR: after the timed runs, each side runs once more with `--profile-steps` (5) steps under
the profiler after its timed steps (Python's torch.profiler; LibTorch's Kineto in train_gpu, in the
Trainer and in plain LibTorch, `--plain 1`); DIR gets the Chrome traces and profile.json, and the
console a side-by-side table: GPU time per step by kernel, the GPU's busy and idle time per step,
kernel launches per step.

Each configuration runs both alternately `repeats` times; the table gives the medians of:
samples/s (timing starts after `warmup` steps, the device synchronised at both ends), their ratio,
MFU (model FLOPs per second over the bf16 matrix-multiply peak measured first in the same run:
the median of timed 8192^3 and 16384x8192x8192 bf16 products on random data, the larger),
startup (launch of the process to the end of the first training step), and the peak GPU memory
the caching allocator held (allocated / reserved). Model FLOPs count the matrix products only:
3 x forward (forward + backward), attention's QK^T and PV included, embeddings, norms and
activations not.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import idle

here = os.path.dirname(os.path.abspath(__file__))


# --- the models' FLOPs ------------------------------------------------------------------------------

def flops_per_sample(a, model):
    """Matrix-product FLOPs of one training sample (forward + backward = 3 x forward)."""
    if model == "cnn":
        conv1 = 2 * 28 * 28 * 32 * 1 * 9
        conv2 = 2 * 14 * 14 * 64 * 32 * 9
        fc = 2 * (64 * 7 * 7 * 128 + 128 * 10)
        return 3 * (conv1 + conv2 + fc)
    d, s, v = a.d_model, a.seq, a.vocab
    per_token = 2 * (d * 3 * d + d * d + d * 4 * d + 4 * d * d + d * v)  # qkv, proj, fc1, fc2, head
    attention = 2 * 2 * s * d  # per token: a row of QK^T and of PV, over all heads
    return 3 * s * (per_token + attention)


# --- the measured peak --------------------------------------------------------------------------------

def measure_peak():
    import torch
    best = {}
    for m, n, k in ((8192, 8192, 8192), (16384, 8192, 8192)):
        g = torch.Generator(device="cuda").manual_seed(m)
        # Two input sets, alternated, so that no product reads what the previous one left in L2.
        sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g),
                 torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g)) for _ in range(2)]
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        for i in range(10):
            torch.mm(*sets[i % 2], out=out)
        times = []
        for i in range(40):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.mm(*sets[i % 2], out=out)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        # Checked against an fp32 product, so that a fast wrong result cannot count.
        a, b = sets[0]
        ref = a[:256].float() @ b.float()
        rel = ((torch.mm(a[:256], b).float() - ref).norm() / ref.norm()).item()
        assert rel < 1e-2, f"bf16 product off by {rel}"
        best[f"{m}x{n}x{k}"] = 2 * m * n * k / statistics.median(times) / 1e12
    return {"peak_tflops": max(best.values()), "by_shape": best, "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__}


# --- Python torch ---------------------------------------------------------------------------------------

def torch_model(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if a.model == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))

    class BlockLM(nn.Module):  # tests/gpu/train_gpu.cpp's BlockLM, layer for layer
        def __init__(self):
            super().__init__()
            d = a.d_model
            self.tok, self.pos = nn.Embedding(a.vocab, d), nn.Embedding(a.seq, d)
            self.ln1, self.ln2, self.lnf = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.head = nn.Linear(d, a.vocab)

        def forward(self, x):
            b, s = x.shape
            d = self.tok.weight.shape[1]
            h = self.tok(x) + self.pos.weight[:s]
            q, k, v = self.qkv(self.ln1(h)).view(b, s, 3, a.heads, d // a.heads).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(q, k, v)
            h = h + self.proj(att.transpose(1, 2).reshape(b, s, d))
            h = h + self.fc2(F.gelu(self.fc1(self.ln2(h))))
            return self.head(self.lnf(h))

    return BlockLM()


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
    if a.model == "cnn":
        data = torch.rand(a.samples, 1, 28, 28, generator=g)
        target = torch.randint(0, 10, (a.samples,), generator=g)
    else:
        tokens = torch.randint(0, a.vocab, (a.samples, a.seq + 1), generator=g)
        data, target = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    torch.manual_seed(1)
    if a.variant == "fused":  # Python's fastest single-process loop: no DDP, SGD's fused kernel
        model = torch_model(a).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=True)
    else:
        model = nn.parallel.DistributedDataParallel(torch_model(a).to(dev), device_ids=[rank])
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.precision)
    scaler = torch.amp.GradScaler("cuda", enabled=a.precision == "fp16")
    step, t0, first_step_done, seconds = 0, time.perf_counter(), 0.0, 0.0
    profiling = a.profile_to and rank == 0
    last = a.warmup + a.steps + (a.profile_steps if profiling else 0)
    prof = None
    while step < last:
        per_rank = torch.randperm(a.samples, generator=g)[rank::a.workers]
        for b in range(0, len(per_rank) - a.batch + 1, a.batch):
            if step == a.warmup:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            if step == a.warmup + a.steps:
                torch.cuda.synchronize()
                seconds = time.perf_counter() - t0
                if profiling:
                    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                              torch.profiler.ProfilerActivity.CUDA])
                    prof.__enter__()
            if step == last:
                break
            idx = per_rank[b:b + a.batch]
            x = data.index_select(0, idx).pin_memory().to(dev, non_blocking=True)
            y = target.index_select(0, idx).pin_memory().to(dev, non_blocking=True)
            opt.zero_grad()
            with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
                logits = model(x)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            step += 1
            if step == 1:
                torch.cuda.synchronize()
                first_step_done = time.time()
    torch.cuda.synchronize()
    if prof is not None:
        prof.__exit__(None, None, None)
        prof.export_chrome_trace(a.profile_to)
    if not seconds:
        seconds = time.perf_counter() - t0
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"impl": "torch " + a.variant, "model": a.model, "precision": a.precision,
                       "steps_per_s": a.steps / seconds, "samples_per_s": a.steps * a.batch * a.workers / seconds,
                       "loss": loss.item(), "first_step_done": first_step_done,
                       "peak_allocated_mib": torch.cuda.max_memory_allocated(dev) / 2**20,
                       "peak_reserved_mib": torch.cuda.max_memory_reserved(dev) / 2**20,
                       "torch": torch.__version__}, f)
    dist.destroy_process_group()


def run_torch(a):
    import torch.multiprocessing as mp
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        os.environ["MASTER_PORT"] = str(29500 + os.getpid() % 1000)
        launched = time.time()
        mp.spawn(torch_worker, args=(a, f.name), nprocs=1 if a.variant == "fused" else a.workers)
        r = json.load(open(f.name))
    r["startup_s"] = r.pop("first_step_done") - launched
    return r


def run_dtrain(a, plain=False, graph=False):
    cmd = [os.path.abspath(a.train_gpu), "--model", a.model, "--precision", a.precision,
           "--workers", str(a.workers), "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--batch", str(a.batch), "--samples", str(a.samples)]
    if plain:
        cmd += ["--plain", "1"]
    if graph:
        cmd += ["--graph", "1"]
    if a.profile_to:
        cmd += ["--profile", a.profile_to, "--profile-steps", str(a.profile_steps)]
    if a.model == "transformer":
        cmd += ["--d-model", str(a.d_model), "--heads", str(a.heads), "--seq", str(a.seq), "--vocab", str(a.vocab)]
    with tempfile.TemporaryDirectory() as cwd:  # the run directory (gpu_runs/) goes there
        out = subprocess.run(cmd + ["--launched", repr(time.time())], check=True, capture_output=True, text=True,
                             cwd=cwd)
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


# --- profiles ------------------------------------------------------------------------------------------

def summarize_trace(path, steps):
    """GPU time per step by kernel, and the GPU's busy time and span, from a Chrome trace."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    kernels, intervals, runtime = {}, [], {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver"):
            r = runtime.setdefault(e["name"], [0, 0.0])
            r[0] += 1
            r[1] += e["dur"]
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        k = kernels.setdefault(e["name"], [0, 0.0])
        k[0] += 1
        k[1] += e["dur"]
        intervals.append((e["ts"], e["ts"] + e["dur"]))
    intervals.sort()
    busy, end = 0.0, None
    for t0, t1 in intervals:
        if end is None or t0 >= end:
            busy += t1 - t0
            end = t1
        elif t1 > end:
            busy += t1 - end
            end = t1
    span = intervals[-1][1] - intervals[0][0] if intervals else 0.0
    return {"busy_ms_per_step": busy / 1e3 / steps, "span_ms_per_step": span / 1e3 / steps,
            "launches_per_step": sum(k[0] for k in kernels.values()) / steps,
            "kernels": {name: {"count": c / steps, "ms_per_step": t / 1e3 / steps} for name, (c, t) in kernels.items()},
            "runtime": {name: {"count": c / steps, "ms_per_step": t / 1e3 / steps} for name, (c, t) in runtime.items()}}


def profile_config(out_dir, a, fused, config):
    """One profiled run of each side; prints the kernels side by side."""
    os.makedirs(out_dir, exist_ok=True)
    tag = config.replace(":", "_")
    sides = {}
    for side, run in (("dtrain", lambda x: run_dtrain(x)), ("dtrain_graph", lambda x: run_dtrain(x, graph=True)),
                      ("libtorch", lambda x: run_dtrain(x, plain=True)), ("torch", run_torch), ("torch_fused", run_torch)):
        if side in ("torch_fused", "dtrain_graph") and a.workers != 1:
            continue
        x = argparse.Namespace(**{**vars(fused if side == "torch_fused" else a),
                                  "profile_to": os.path.abspath(os.path.join(out_dir, f"{tag}_{side}.json"))})
        run(x)
        sides[side] = summarize_trace(x.profile_to, a.profile_steps)
    names = sorted({n for s in sides.values() for n in s["kernels"]},
                   key=lambda n: -max(s["kernels"].get(n, {"ms_per_step": 0})["ms_per_step"] for s in sides.values()))
    print(f"\nprofile {config}: GPU ms per step ({a.profile_steps} steps)", flush=True)
    print(f"{'':<72}" + "".join(f"{side:>13}" for side in sides))
    for key in ("busy_ms_per_step", "span_ms_per_step", "launches_per_step"):
        print(f"{key:<72}" + "".join(f"{s[key]:>13.2f}" for s in sides.values()))
    for n in names[:30]:
        print(f"{n[:71]:<72}" + "".join(f"{s['kernels'].get(n, {'ms_per_step': 0})['ms_per_step']:>13.3f}"
                                         for s in sides.values()))
    print("host: CUDA runtime calls per step (count / ms)")
    for n in sorted({n for s in sides.values() for n in s["runtime"]}):
        print(f"{n[:71]:<72}" + "".join(
            f"{s['runtime'].get(n, {'count': 0})['count']:>6.0f}/{s['runtime'].get(n, {'ms_per_step': 0})['ms_per_step']:<6.2f}"
            for s in sides.values()))
    result = {"config": config, "sides": sides}
    with open(os.path.join(out_dir, f"{tag}_profile.json"), "w") as f:
        json.dump(result, f, indent=1)
    return {"config": config, **{side: {k: v for k, v in s.items() if k not in ("kernels", "runtime")}
                                 for side, s in sides.items()}}


def median(runs, key):
    return statistics.median(r[key] for r in runs)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-gpu", default=os.path.join(here, "..", "build-gpu", "tests", "gpu", "train_gpu"))
    p.add_argument("--configs", default="cnn:fp16,cnn:bf16,cnn:fp32,transformer:bf16")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--cnn-steps", type=int, default=300)
    p.add_argument("--cnn-batch", type=int, default=256)
    p.add_argument("--tf-steps", type=int, default=50)
    p.add_argument("--tf-batch", type=int, default=16)
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--json", help="write every run's figures here")
    p.add_argument("--profile", metavar="DIR", help="profile each side once more; traces and profile.json in DIR")
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--profile-configs", help="the configurations to profile (default: all of --configs)")
    p.add_argument("--measure-peak", action="store_true", help=argparse.SUPPRESS)
    idle.add_argument(p)
    args = p.parse_args()
    if args.measure_peak:
        print(json.dumps(measure_peak()))
        return 0
    if not os.access(args.train_gpu, os.X_OK):
        p.error(f"no train_gpu at {args.train_gpu}: build the target dtrain_train_gpu (scripts/gpu-run) "
                "and pass --train-gpu")

    # The peak in a process of its own, so that the runs below start on an idle device.
    peak = json.loads(subprocess.run([sys.executable, __file__, "--measure-peak"], check=True,
                                     capture_output=True, text=True).stdout.splitlines()[-1])
    print(json.dumps(peak), flush=True)
    rows, everything, loads = [], {"peak": peak, "configs": []}, []
    idle.wait(args.allow_load)
    for config in args.configs.split(","):
        model, precision = config.split(":")
        cnn = model == "cnn"
        a = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "profile"}, model=model,
                               precision=precision, variant="ddp", profile_to=None,
                               steps=args.cnn_steps if cnn else args.tf_steps,
                               batch=args.cnn_batch if cnn else args.tf_batch,
                               samples=60000 if cnn else max(4096, 4 * args.tf_batch * args.workers))
        fused = argparse.Namespace(**{**vars(a), "variant": "fused"})
        ours, ours_graph, theirs, theirs_fused = [], [], [], []

        def measured(side, run, x):
            with idle.Run() as r:
                side.append(run(x))
            side[-1]["load"] = r.record
            loads.append(r.record)

        for _ in range(args.repeats):
            measured(theirs, run_torch, a)
            if args.workers == 1:
                measured(theirs_fused, run_torch, fused)
            measured(ours, run_dtrain, a)
            if args.workers == 1:
                try:
                    measured(ours_graph, lambda x: run_dtrain(x, graph=True), a)
                except subprocess.CalledProcessError as e:  # the other sides' figures still count
                    print(f"dtrain graph failed ({config}): {e.stderr[-2000:]}", file=sys.stderr, flush=True)
        flops = flops_per_sample(a, model)
        row = {"model": model, "precision": precision, "batch_per_gpu": a.batch, "steps": a.steps,
               "flops_per_sample": flops}
        for side, runs in (("dtrain", ours), ("dtrain_graph", ours_graph), ("torch", theirs),
                           ("torch_fused", theirs_fused)):
            if not runs:
                continue
            sps = median(runs, "samples_per_s")
            row[side] = {"samples_per_s": sps, "mfu": sps * flops / a.workers / (peak["peak_tflops"] * 1e12),
                         "startup_s": median(runs, "startup_s"), "loss": runs[-1]["loss"],
                         "peak_allocated_mib": median(runs, "peak_allocated_mib"),
                         "peak_reserved_mib": median(runs, "peak_reserved_mib"),
                         "samples_per_s_runs": [r["samples_per_s"] for r in runs]}
        row["ratio"] = row["dtrain"]["samples_per_s"] / row["torch"]["samples_per_s"]
        if theirs_fused:
            row["ratio_fused"] = row["dtrain"]["samples_per_s"] / row["torch_fused"]["samples_per_s"]
        if ours_graph:
            row["ratio_graph"] = row["dtrain_graph"]["samples_per_s"] / row["torch"]["samples_per_s"]
            row["ratio_graph_fused"] = row["dtrain_graph"]["samples_per_s"] / row["torch_fused"]["samples_per_s"]
        rows.append(row)
        everything["configs"].append({**row, "dtrain_runs": ours, "dtrain_graph_runs": ours_graph, "torch_runs": theirs,
                                      "torch_fused_runs": theirs_fused})
        print(json.dumps(row), flush=True)
        if args.profile and config in (args.profile_configs or args.configs).split(","):
            everything.setdefault("profiles", []).append(profile_config(args.profile, a, fused, config))
    everything["load"] = idle.verdict(loads)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)

    print(f"\n{peak['device']}, torch {peak['torch']}: measured bf16 matmul peak {peak['peak_tflops']:.0f} TFLOP/s")
    for r in rows:
        if "torch_fused" in r:
            print(f"{r['model']} {r['precision']}: torch fused single-process {r['torch_fused']['samples_per_s']:.0f} "
                  f"samples/s (MFU {100 * r['torch_fused']['mfu']:.1f} %); dtrain/that {r['ratio_fused']:.2f}")
        if "dtrain_graph" in r:
            print(f"{r['model']} {r['precision']}: dtrain graph {r['dtrain_graph']['samples_per_s']:.0f} samples/s "
                  f"(MFU {100 * r['dtrain_graph']['mfu']:.1f} %); /torch {r['ratio_graph']:.2f}, "
                  f"/torch fused {r['ratio_graph_fused']:.2f}")
    print(f"{'model':<12}{'prec':<6}{'dtrain sam/s':>13}{'torch sam/s':>13}{'ratio':>7}{'MFU d/t %':>12}"
          f"{'startup d/t s':>15}{'peak alloc d/t MiB':>20}{'loss d/t':>13}")
    for r in rows:
        d, t = r["dtrain"], r["torch"]
        print(f"{r['model']:<12}{r['precision']:<6}{d['samples_per_s']:>13.0f}{t['samples_per_s']:>13.0f}"
              f"{r['ratio']:>7.2f}{100 * d['mfu']:>6.1f}/{100 * t['mfu']:<5.1f}"
              f"{d['startup_s']:>8.1f}/{t['startup_s']:<6.1f}"
              f"{d['peak_allocated_mib']:>11.0f}/{t['peak_allocated_mib']:<8.0f}"
              f"{d['loss']:>7.3f}/{t['loss']:<5.3f}")
    print(f"(workers {args.workers}; median of {args.repeats}; timed steps after {args.warmup} warm-up steps; "
          f"MFU against the measured peak; transformer d={args.d_model} heads={args.heads} seq={args.seq} "
          f"vocab={args.vocab} batch={args.tf_batch})")
    idle.refuse(everything["load"], args.allow_load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
