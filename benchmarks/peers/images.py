#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Image-folder classification with a ResNet-18, trained by PyTorch DistributedDataParallel on CPU
(Gloo): the Python peer of examples/image_classifier (benchmarks/vs_image_peer.py runs both).

    tests/tools/venv-python benchmarks/peers/images.py --root DIR [--workers 2] [--global-batch 128]
        [--epochs 1] [--max-steps 0] [--width 16] [--channels 1|3] [--mean 0.2860] [--std 0.3530]
        [--loader-workers 0] [--threads-per-worker 1] [--seed 0] [--decode-only] [--compile]

DIR holds train/<class>/<image> and test/<class>/<image>, as torchvision's ImageFolder reads them
(scripts/make-image-folder DIR makes one from Fashion-MNIST).

The work, so that another implementation can do the same:
  decoding    PIL, converted to one channel ("L") with --channels 1, to RGB with --channels 3; each
              worker decodes its own samples, in its training process (--loader-workers 0) or in
              that many DataLoader processes
  train       RandomHorizontalFlip(0.5), ToTensor, Normalize(--mean, --std) on every channel
  test        ToTensor, Normalize
  model       ResNet-18 for small images, with torchvision's parameter names: conv1 3x3 stride 1
              and no max-pool, then four stages of two BasicBlocks of widths w, 2w, 4w, 8w
              (w = --width; 64 is the standard ResNet-18; a stage after the first starts with
              stride 2 and a 1x1 convolution on the shortcut), BatchNorm2d, global average pool,
              Linear(8w, classes)
  training    DDP over N spawned workers, SGD(lr 0.05, momentum 0.9, weight decay 5e-4) with
              CosineAnnealingLR over the epochs (stepped after each epoch), cross-entropy, the global
              batch split evenly, DistributedSampler(shuffle, seed 0), torch.manual_seed(--seed)
  evaluation  rank 0, eager, the whole test folder in batches of 256

--decode-only times the input pipeline alone: each worker iterates its train loader for --max-steps
batches (100 unless given), no model; the JSON line then gives decode_samples_per_s (decoding,
augmenting and collating, all workers) and "mode": "decode-only". Otherwise the JSON line gives
final_train_loss (rank 0's last), test_accuracy, the timing of benchmarks/peers/common.py, the
configuration, "mode" (eager or compile) and "torch".
"""
import time

START = time.time()  # before the heavy imports: startup_s and wall_s count them

import os  # noqa: E402

import common  # noqa: E402  (sets the thread variables before torch loads)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402
from torchvision import datasets, transforms  # noqa: E402


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + shortcut)


class ResNet18(nn.Module):
    def __init__(self, channels, classes, width):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        cin = width
        for stage in range(4):
            cout = width << stage
            stride = 1 if stage == 0 else 2
            setattr(self, "layer%d" % (stage + 1), nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Decode:
    """ImageFolder's loader: PIL, converted to `mode` (a class, not a closure: DataLoader processes
    receive it pickled)."""

    def __init__(self, mode):
        self.mode = mode

    def __call__(self, path):
        with open(path, "rb") as f:
            return Image.open(f).convert(self.mode)


def folder(args, split, augment):
    norm = transforms.Normalize([args.mean] * args.channels, [args.std] * args.channels)
    steps = ([transforms.RandomHorizontalFlip(0.5)] if augment else []) + [transforms.ToTensor(), norm]
    try:
        return datasets.ImageFolder(os.path.join(args.root, split), loader=Decode("L" if args.channels == 1 else "RGB"),
                                    transform=transforms.Compose(steps))
    except OSError as e:  # no image in the class folders (FileNotFoundError)
        raise common.UserError("%s/%s: %s" % (args.root, split, e))


def decode_only(rank, args, loader):
    dist.barrier()
    t0, n = time.time(), 0
    for i, (x, _) in enumerate(loader):
        n += len(x)
        if i + 1 >= args.max_steps:
            break
    dist.barrier()
    loop_s = time.time() - t0
    total = torch.tensor([float(n)])
    dist.all_reduce(total)
    if rank != 0:
        return None
    return {"mode": "decode-only", "workers": args.workers, "loader_workers": args.loader_workers,
            "samples": int(total.item()), "decode_samples_per_s": round(total.item() / loop_s, 1)}


def worker(rank, args):
    torch.manual_seed(args.seed)
    train = folder(args, "train", augment=True)
    sampler = DistributedSampler(train, num_replicas=args.workers, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.global_batch // args.workers, sampler=sampler,
                        num_workers=args.loader_workers)
    if args.decode_only:
        return decode_only(rank, args, loader)
    model, net = common.distribute(ResNet18(args.channels, len(train.classes), args.width), args.compile)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    def step(batch):
        x, y = batch
        return F.cross_entropy(model(x), y), len(y)

    loop = common.Loop(START)
    loop.train(args, optimizer, loader, sampler, step, after_epoch=schedule.step)
    samples, _, _ = loop.totals()
    if rank != 0:
        return None
    net.eval()
    correct = seen = 0
    with torch.no_grad():
        for x, y in DataLoader(folder(args, "test", augment=False), batch_size=256, num_workers=args.loader_workers):
            correct += int((net(x).argmax(1) == y).sum())
            seen += len(y)
    result = {"model": "resnet18", "width": args.width, "workers": args.workers, "loader_workers": args.loader_workers,
              "global_batch": args.global_batch, "epochs": args.epochs, "threads_per_worker": args.threads_per_worker,
              "final_train_loss": round(loop.last_loss, 5), "test_accuracy": round(correct / max(1, seen), 4),
              "classes": len(train.classes)}
    result.update(loop.timing(samples))
    return result


def main():
    p = common.parser(__doc__, workers=2, global_batch=128)
    p.add_argument("--root", required=True, help="an image folder with train/ and test/")
    p.add_argument("--loader-workers", type=int, default=0, help="DataLoader processes per worker (0: none)")
    p.add_argument("--width", type=int, default=16, help="the first stage's channels (default %(default)s)")
    p.add_argument("--channels", type=int, choices=[1, 3], default=1)
    p.add_argument("--mean", type=float, default=0.2860)
    p.add_argument("--std", type=float, default=0.3530)
    p.add_argument("--decode-only", action="store_true", help="time the input pipeline alone")
    args = p.parse_args()
    common.check(p, args)
    if args.loader_workers < 0 or args.width < 1 or args.std <= 0:
        p.error("--loader-workers must be 0 or more, --width at least 1 and --std positive")
    for split in ("train", "test"):
        path = os.path.join(args.root, split)
        if not os.path.isdir(path):
            common.fail("images.py", "--root %s has no %s/ folder (scripts/make-image-folder DIR makes one)"
                        % (args.root, split))
        if not any(entry.is_dir() for entry in os.scandir(path)):
            common.fail("images.py", "%s has no class folder (<class>/<image>)" % path)
    if args.decode_only and not args.max_steps:
        args.max_steps = 100
    common.emit(common.run(worker, args, START))


if __name__ == "__main__":
    main()
