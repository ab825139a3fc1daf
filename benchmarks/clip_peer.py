# SPDX-License-Identifier: Apache-2.0
"""PyTorch DistributedDataParallel peer (CPU, Gloo) of examples/dog_breeds: Ray Train's dog-breed
workload as a plain PyTorch loop, the same work epoch for epoch. Prints ONE JSON line with the
example's keys.

    tests/tools/venv-python benchmarks/clip_peer.py --model-dir DIR --data ROOT [--workers 2]
        [--epochs 20] [--batch 256] [--lr 1e-3] [--lr-factor 0.8] [--lr-patience 3] [--embed-batch 64]
        [--loader-threads 2] [--threads-per-worker 1] [--seed 0]

Runs with the environment of scripts/python-env (torch, torchvision, transformers, Pillow). The work:
  images     ROOT/{train,val,test}: torchvision's ImageFolder, each file opened with PIL,
             convert("RGB"), through the model directory's CLIPImageProcessor (its PIL backend), in
             the DataLoader's --loader-threads worker processes
  embeddings in each training process, as the tutorial's embedding stage computes them: under
             torch.inference_mode, CLIPModel.get_image_features on chunks of --embed-batch rows of
             every batch, then copied out of inference mode for the head
  head       the tutorial's ClassificationModel: Linear(projection_dim, 256), BatchNorm1d, ReLU,
             Dropout(0.3), Linear(256, breeds) in DDP; Adam(lr); ReduceLROnPlateau(mode min,
             factor, patience) on each epoch's validation loss
  batches    DistributedSampler(shuffle, seed) + DataLoader(batch / workers)
  each epoch validation over the ranks (loss and correct summed); the best state by val_loss kept;
             at the end the best state scores ROOT/test over the ranks
train_samples_per_s: samples trained over the slowest rank's epoch loops (loop_s), decoding, the
processor and the embeddings included (end to end), validation not; train_s: the epochs with their
validations, as the example's (its fit).
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

import argparse
import copy
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Processed(Dataset):
    """An ImageFolder's files through the CLIP processor: (pixel_values [3, H, W], label)."""

    def __init__(self, root, model_dir):
        from torchvision.datasets import ImageFolder
        from transformers import CLIPImageProcessorPil

        self.folder = ImageFolder(root)
        self.processor = CLIPImageProcessorPil.from_pretrained(model_dir)

    def __len__(self):
        return len(self.folder.samples)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.folder.samples[i]
        with Image.open(path) as im:
            pixels = self.processor(im.convert("RGB"), return_tensors="pt")["pixel_values"][0]
        return pixels, label


class Head(nn.Module):
    """The tutorial's ClassificationModel."""

    def __init__(self, embedding_dim, hidden_dim, num_classes, dropout_p=0.3):
        super().__init__()
        self.fc1 = nn.Linear(embedding_dim, hidden_dim)
        self.batch_norm = nn.BatchNorm1d(hidden_dim)
        self.dropout = nn.Dropout(dropout_p)
        self.fc2 = nn.Linear(hidden_dim, num_classes)

    def forward(self, x):
        return self.fc2(self.dropout(torch.relu(self.batch_norm(self.fc1(x)))))


def features(out):
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def worker(rank, args, port, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(args.threads_per_worker)
    from transformers import CLIPModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    clip = CLIPModel.from_pretrained(args.model_dir).eval()

    def embeddings(pixels):
        with torch.inference_mode():
            out = torch.cat([features(clip.get_image_features(pixel_values=p)) for p in pixels.split(args.embed_batch)])
        return out.clone()

    splits = {s: Processed(os.path.join(args.data, s), args.model_dir) for s in ("train", "val", "test")}
    classes = splits["train"].folder.classes
    torch.manual_seed(args.seed)
    head = DDP(Head(clip.config.projection_dim, 256, len(classes)))
    optimizer = torch.optim.Adam(head.parameters(), lr=args.lr)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=args.lr_factor,
                                                         patience=args.lr_patience)
    sampler = DistributedSampler(splits["train"], num_replicas=args.workers, rank=rank, shuffle=True, seed=args.seed)
    # Persistent loader processes (made once, not each epoch), as the example's loader threads are.
    loading = dict(num_workers=args.loader_threads, persistent_workers=args.loader_threads > 0)
    loader = DataLoader(splits["train"], batch_size=args.batch // args.workers, sampler=sampler, **loading)
    evaluation = {}

    def scored(split):
        """Loss sum, correct and count over the ranks (rank r takes the contiguous r-th block)."""
        if split not in evaluation:
            data = splits[split]
            n = len(data)
            block = (n + args.workers - 1) // args.workers
            part = torch.utils.data.Subset(data, list(range(rank * block, min(n, (rank + 1) * block))))
            evaluation[split] = DataLoader(part, batch_size=args.batch, **loading)
        sums = torch.zeros(3, dtype=torch.float64)
        head.eval()
        for x, y in evaluation[split]:
            with torch.no_grad():
                logits = head.module(embeddings(x))
            sums += torch.tensor([nn.functional.cross_entropy(logits, y, reduction="sum").item(),
                                  logits.argmax(1).eq(y).sum().item(), len(y)], dtype=torch.float64)
        dist.all_reduce(sums)
        return sums

    samples, loop_s, best = 0, 0.0, (float("inf"), 0.0, -1, None)
    train_start = time.time()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        head.train()
        dist.barrier()
        e0 = time.time()
        losses = []
        for x, y in loader:
            e = embeddings(x)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(head(e), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            samples += len(y)
        loop_s += time.time() - e0
        v = scored("val")
        val_loss, val_accuracy = (v[0] / v[2]).item(), (v[1] / v[2]).item()
        plateau.step(val_loss)
        if val_loss < best[0]:
            best = (val_loss, val_accuracy, epoch, copy.deepcopy(head.module.state_dict()))
    train_s = time.time() - train_start
    totals = torch.tensor([float(samples), loop_s], dtype=torch.float64)
    slowest = torch.tensor([loop_s], dtype=torch.float64)
    dist.all_reduce(totals)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    head.module.load_state_dict(best[3])
    t = scored("test")
    if rank == 0:
        queue.put({"model": "clip head", "workers": args.workers, "batch": args.batch, "epochs": args.epochs,
                   "breeds": len(classes), "train_images": len(splits["train"]), "val_images": len(splits["val"]),
                   "test_images": len(splits["test"]), "embedding_dim": clip.config.projection_dim,
                   "train_samples_per_s": round(totals[0].item() / slowest.item(), 3),
                   "loop_s": round(slowest.item(), 3), "train_s": round(train_s, 3),
                   "best_epoch": best[2], "val_loss": round(best[0], 5), "val_accuracy": round(best[1], 4),
                   "test_accuracy": round((t[1] / t[2]).item(), 4),
                   "wall_s": round(time.time() - _SCRIPT_START, 3)})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-factor", type=float, default=0.8)
    p.add_argument("--lr-patience", type=int, default=3)
    p.add_argument("--embed-batch", type=int, default=64)
    p.add_argument("--loader-threads", type=int, default=2)
    p.add_argument("--threads-per-worker", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.batch % args.workers:
        p.error("--batch must be a multiple of --workers")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(args, port, queue), nprocs=args.workers, join=True)
    print(json.dumps(queue.get()))


if __name__ == "__main__":
    main()
