#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch DistributedDataParallel peer (CPU, Gloo) of examples/image_classifier --weights: torchvision's
resnet18 with the small-image stem, started from a torchvision state_dict, trained on an image folder.

    /usr/bin/python3 benchmarks/resnet_peer.py --root DIR --weights FILE [--workers 2] [--epochs 1]
        [--max-steps 0] [--global-batch 128] [--channels 1|3] [--mean X] [--std X] [--seed 0]
        [--threads-per-worker 1] [--loader-workers 0] [--width 64]

The work, the example's (and benchmarks/peers/images.py's but for the model):
  decode    = PIL, converted to 1 channel ("L") with --channels 1 or RGB with --channels 3
  train     = RandomHorizontalFlip(0.5) -> ToTensor -> Normalize(--mean, --std) (per channel)
  test      = ToTensor -> Normalize
  model     = torchvision.models.resnet18(num_classes=classes) with conv1 = Conv2d(channels, 64, 3, 1, 1,
              bias=False) and maxpool = nn.Identity() (torch.manual_seed(--seed) first), then FILE's
              tensors (torch.save or .safetensors; examples/torchvision_resnet18.py makes one) loaded
              strictly, but for fc when FILE's has another number of classes or none (as
              nn::load_pretrained): those stay as initialised
  optimiser = SGD(lr 0.05, momentum 0.9, weight_decay 5e-4), CosineAnnealingLR over the epochs (per epoch)
  batches   = global batch split over the workers, DistributedSampler(seed=0, shuffle)
Rank 0 evaluates on the test folder; ONE JSON line is printed. Timing as benchmarks/peers/images.py: startup_s =
script start -> first optimizer step on rank 0; train_samples_per_s = samples over the loop between
two barriers (includes decoding).
"""
import time

_SCRIPT_START = time.time()

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torchvision
from PIL import Image
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms


def read_weights(path):
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        return load_file(path)
    return torch.load(path, map_location="cpu")


def pretrained_resnet18(args, classes):
    """torchvision's resnet18 with the small-image stem, FILE's weights in; returns it and the report."""
    torch.manual_seed(args.seed)
    model = torchvision.models.resnet18(num_classes=classes)
    model.conv1 = nn.Conv2d(args.channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    state = read_weights(args.weights)
    if tuple(state.get("fc.weight", torch.empty(0)).shape) != tuple(model.fc.weight.shape):
        state.pop("fc.weight", None), state.pop("fc.bias", None)  # a new head for the folder's classes
        state["fc.weight"], state["fc.bias"] = model.fc.weight.detach(), model.fc.bias.detach()
        fresh = ["fc.weight", "fc.bias"]
    else:
        fresh = []
    model.load_state_dict(state, strict=True)  # raises naming any other missing or unexpected key
    return model, {"weights_loaded": len(state) - len(fresh), "weights_missing": len(fresh)}


def folders(args):
    mode = "L" if args.channels == 1 else "RGB"

    def load(path):
        with open(path, "rb") as f:
            return Image.open(f).convert(mode)

    norm = transforms.Normalize([args.mean] * args.channels, [args.std] * args.channels)
    train = datasets.ImageFolder(os.path.join(args.root, "train"), loader=load, transform=transforms.Compose(
        [transforms.RandomHorizontalFlip(0.5), transforms.ToTensor(), norm]))
    test = datasets.ImageFolder(os.path.join(args.root, "test"), loader=load,
                                transform=transforms.Compose([transforms.ToTensor(), norm]))
    return train, test


def worker(rank, args, port, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(args.threads_per_worker)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    train, test = folders(args)
    net, report = pretrained_resnet18(args, len(train.classes))
    model = DDP(net)
    sampler = DistributedSampler(train, num_replicas=args.workers, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.global_batch // args.workers, sampler=sampler,
                        num_workers=args.loader_workers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    steps = samples = 0
    first_step, first_loss, last_loss = None, float("nan"), float("nan")
    dist.barrier()
    t0 = time.time()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if first_step is None:
                first_step, first_loss = time.time(), loss.item()
            steps += 1
            samples += len(y)
            last_loss = loss.item()
            if args.max_steps and steps >= args.max_steps:
                break
        schedule.step()
        if args.max_steps and steps >= args.max_steps:
            break
    dist.barrier()
    loop_s = time.time() - t0
    total = torch.tensor([float(samples)])
    dist.all_reduce(total)
    if rank == 0:
        net.eval()  # not DDP's forward: it would broadcast buffers to ranks that are not evaluating
        correct = seen = 0
        with torch.no_grad():
            for x, y in DataLoader(test, batch_size=256, num_workers=args.loader_workers):
                correct += (net(x).argmax(1) == y).sum().item()
                seen += len(y)
        queue.put(dict(report, model="resnet18", width=64, weights=args.weights, workers=args.workers,
                       loader_workers=args.loader_workers, global_batch=args.global_batch, epochs=args.epochs,
                       steps=steps, train_samples=int(total.item()), train_loop_s=round(loop_s, 3),
                       train_samples_per_s=round(total.item() / loop_s, 2),
                       startup_s=round(first_step - _SCRIPT_START, 3), first_train_loss=round(first_loss, 5),
                       final_train_loss=round(last_loss, 5), test_accuracy=round(correct / seen, 4),
                       classes=len(train.classes), train_images=len(train), test_images=len(test),
                       threads_per_worker=args.threads_per_worker, torch=torch.__version__))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True)
    p.add_argument("--weights", required=True, help="a torchvision resnet18 state_dict (examples/torchvision_resnet18.py)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads-per-worker", type=int, default=1)
    p.add_argument("--loader-workers", type=int, default=0)
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--width", type=int, default=64, choices=[64], help="torchvision's resnet18 is 64 wide")
    p.add_argument("--channels", type=int, choices=[1, 3], default=1)
    p.add_argument("--mean", type=float, default=0.2860)
    p.add_argument("--std", type=float, default=0.3530)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.global_batch % args.workers:
        p.error("--global-batch must be divisible by --workers")
    if not os.path.isfile(args.weights):
        p.error("--weights %s: no such file; make one with examples/torchvision_resnet18.py %s" % (args.weights, args.weights))
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads_per_worker))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(args, port, queue), nprocs=args.workers, join=True)
    result = queue.get()
    result["wall_s"] = round(time.time() - _SCRIPT_START, 3)
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
