# SPDX-License-Identifier: Apache-2.0
"""PyTorch DistributedDataParallel peer (CPU, Gloo) of examples/finetune_vit: a ViT fine-tuned on an
image folder through transformers' ViTForImageClassification, with an evaluation every N steps, the
same work step for step. Prints ONE JSON line with the example's keys.

    tests/tools/venv-python benchmarks/vit_peer.py --model-dir DIR --data ROOT [--workers 2]
        [--threads-per-worker 1] [--global-batch 32] [--epochs 1] [--max-steps 0] [--eval-every 50]
        [--val-fraction 0.1] [--lr 2e-4] [--weight-decay 0.01] [--warmup 0.1] [--seed 0]

Runs with the environment of scripts/python-env (torch, torchvision, transformers, Pillow). The work,
fixed so that the example does exactly the same:
  images    = torchvision's ImageFolder(ROOT/train) and (ROOT/test), opened with PIL, convert("RGB"),
              through the model directory's ViTImageProcessor (PIL backend), all up front
  split     = ROOT/train stratified by class: minilm_peer.py's split (per class, sorted, its images
              in folder order shuffled with random.Random(seed), the first round(val_fraction * n)
              to validation): dtrain's data::stratified_split; split_fnv1a compares the two
  model     = ViTForImageClassification.from_pretrained(model dir, num_labels=K, the folder's
              classes as id2label, ignore_mismatched_sizes): the directory's backbone, a new head
  optimizer = AdamW(lr, weight_decay) over every parameter
  schedule  = per step t of T (--max-steps, else steps_per_epoch * epochs): lr * (0.1 + 0.9 t / W)
              for t < W = floor(warmup * T), then lr * (1 + cos(pi (t - W) / (T - W))) / 2:
              dtrain's schedule::WarmupCosine with start_factor 0.1 and min_lr 0
  batches   = DistributedSampler(shuffle, seed) + DataLoader(global batch / workers), epochs
              re-drawn until T steps
  every --eval-every steps and at step T: validation over the ranks (loss and accuracy summed), the
              best state by val_loss kept (the Trainer's load_best_model_at_end); at the end the best
              state scores ROOT/test
Timing as the example's: train_samples_per_s = samples trained over the training time, which is the
loop's time less the evaluations' (each from a barrier to a barrier).
"""
import time

_SCRIPT_START = time.time()

import os as _os
import sys as _sys

_threads = "1"
for _i, _a in enumerate(_sys.argv):
    if _a == "--threads-per-worker" and _i + 1 < len(_sys.argv):
        _threads = _sys.argv[_i + 1]
_os.environ.setdefault("OPENBLAS_NUM_THREADS", _threads)
_os.environ.setdefault("OMP_NUM_THREADS", _threads)
_os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse
import copy
import json
import math
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from minilm_peer import fnv1a, lr_factor, stratified_split


def processor_of(model_dir):
    try:
        from transformers import ViTImageProcessorPil as Processor  # the PIL backend, as dtrain computes it
    except ImportError:
        from transformers import ViTImageProcessor as Processor
    return Processor.from_pretrained(model_dir)


def processed(processor, folder):
    """Every image of a torchvision ImageFolder through the processor: pixel_values, labels."""
    from PIL import Image

    chunks = []
    for begin in range(0, len(folder.samples), 512):
        images = []
        for path, _ in folder.samples[begin:begin + 512]:
            with Image.open(path) as im:
                images.append(im.convert("RGB"))
        chunks.append(processor(images, return_tensors="pt")["pixel_values"])
    return torch.cat(chunks), torch.tensor(folder.targets, dtype=torch.long)


def prepare(args):
    from torchvision.datasets import ImageFolder

    t0 = time.time()
    processor = processor_of(args.model_dir)
    train_folder = ImageFolder(os.path.join(args.data, "train"))
    test_folder = ImageFolder(os.path.join(args.data, "test"))
    if train_folder.classes != test_folder.classes:
        raise SystemExit("vit_peer: %s/test's classes are not train/'s" % args.data)
    x, y = processed(processor, train_folder)
    train, val = stratified_split([train_folder.classes[l] for l in y.tolist()], args.val_fraction, args.seed)
    data = {"train": (x[train], y[train]), "val": (x[val], y[val]), "test": processed(processor, test_folder)}
    return data, train_folder.classes, fnv1a(train), time.time() - t0


def worker(rank, args, port, prepared, queue):
    data, classes, split_fnv, pipeline_s = prepared
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(args.threads_per_worker)
    from transformers import ViTForImageClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "some weights are newly initialized": the head, as intended
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    torch.manual_seed(args.seed)
    model = ViTForImageClassification.from_pretrained(
        args.model_dir, num_labels=len(classes), id2label=dict(enumerate(classes)),
        label2id={c: i for i, c in enumerate(classes)}, ignore_mismatched_sizes=True)
    model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    train = TensorDataset(*data["train"])
    sampler = DistributedSampler(train, num_replicas=args.workers, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.global_batch // args.workers, sampler=sampler)
    total_steps = args.max_steps or len(loader) * args.epochs
    epochs = math.ceil(total_steps / len(loader))
    warmup = int(args.warmup * total_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: lr_factor(t, warmup, total_steps))
    vx, vy = data["val"]  # validation over the ranks: rank r takes rows r, r + world, ...; sums all-reduced
    vx, vy = vx[rank::args.workers], vy[rank::args.workers]
    state = {"steps": 0, "samples": 0, "evals": 0, "train_s": 0.0, "eval_s": 0.0, "best": (float("inf"), 0, 0, None)}

    def evaluate(last_loss):
        dist.barrier()
        e0 = time.time()
        state["train_s"] += e0 - state["segment"]
        model.eval()
        sums = torch.zeros(3, dtype=torch.float64)  # loss, correct, count
        with torch.no_grad():
            for begin in range(0, len(vy), 64):
                logits = model.module(pixel_values=vx[begin:begin + 64]).logits
                y = vy[begin:begin + 64]
                sums += torch.tensor([nn.functional.cross_entropy(logits, y, reduction="sum").item(),
                                      logits.argmax(1).eq(y).sum().item(), len(y)], dtype=torch.float64)
        dist.all_reduce(sums)
        model.train()
        val_loss, val_accuracy = (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()
        state["evals"] += 1
        state["last"] = (val_loss, val_accuracy, last_loss)
        if rank == 0 and val_loss < state["best"][0]:
            state["best"] = (val_loss, val_accuracy, state["steps"], copy.deepcopy(model.module.state_dict()))
        dist.barrier()
        state["segment"] = time.time()
        state["eval_s"] += state["segment"] - e0

    first_step = None
    last_loss = float("nan")
    model.train()
    dist.barrier()
    state["segment"] = time.time()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(pixel_values=x).logits, y)
            loss.backward()
            optimizer.step()
            schedule.step()
            if first_step is None:
                first_step = time.time()
            state["samples"] += len(y)
            last_loss = loss.item()
            state["steps"] += 1
            if state["steps"] % args.eval_every == 0 or state["steps"] == total_steps:
                evaluate(last_loss)
            if state["steps"] >= total_steps:
                break
        if state["steps"] >= total_steps:
            break
    total = torch.tensor([float(state["samples"])])
    dist.all_reduce(total)
    if rank == 0:
        # The best state by val_loss on ROOT/test.
        val_loss, val_accuracy, best_step, best_state = state["best"]
        model.module.load_state_dict(best_state)
        model.eval()
        tx, ty = data["test"]
        h0 = time.time()
        correct = 0
        with torch.no_grad():
            for begin in range(0, len(ty), 256):
                correct += model.module(pixel_values=tx[begin:begin + 256]).logits.argmax(1).eq(ty[begin:begin + 256]).sum().item()
        test_s = time.time() - h0
        queue.put({"model": "vit", "workers": args.workers, "threads_per_worker": args.threads_per_worker,
                   "global_batch": args.global_batch, "steps": state["steps"], "total_steps": total_steps,
                   "warmup_steps": warmup, "eval_every": args.eval_every, "evals": state["evals"],
                   "train_samples": int(total.item()), "train_s": round(state["train_s"], 3),
                   "eval_s": round(state["eval_s"], 3),
                   "train_samples_per_s": round(total.item() / state["train_s"], 2),
                   "startup_s": round(first_step - _SCRIPT_START, 3), "pipeline_s": round(pipeline_s, 3),
                   "final_train_loss": round(last_loss, 5), "final_val_loss": round(state["last"][0], 5),
                   "final_val_accuracy": round(state["last"][1], 4), "best_step": best_step,
                   "val_loss": round(val_loss, 5), "val_accuracy": round(val_accuracy, 4),
                   "test_accuracy": round(correct / len(ty), 4), "test_s": round(test_s, 3),
                   "classes": len(classes), "train_images": len(train), "val_images": len(data["val"][1]),
                   "test_images": len(ty), "split_fnv1a": split_fnv, "image_size": int(tx.shape[-1]),
                   "lr": args.lr, "weight_decay": args.weight_decay,
                   "attn_implementation": model.module.config._attn_implementation, "torch": torch.__version__})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True, help="a ViTForImageClassification directory (examples/make_vit.py)")
    p.add_argument("--data", required=True, help="an image folder with train/ and test/ (scripts/make-image-folder)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads-per-worker", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.global_batch % args.workers:
        p.error("--global-batch must be divisible by --workers")
    if args.eval_every < 1:
        p.error("--eval-every must be >= 1")
    prepared = prepare(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(args, port, prepared, queue), nprocs=args.workers, join=True)
    result = queue.get()
    result["wall_s"] = round(time.time() - _SCRIPT_START, 3)
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
