#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fashion-MNIST trained by PyTorch DistributedDataParallel on CPU (Gloo): the Python peer of
examples/fashion_mnist (benchmarks/vs_peer.py runs both).

    tests/tools/venv-python benchmarks/peers/fashion_mnist.py [--model cnn|mlp] [--workers 1]
        [--global-batch 128] [--epochs 1] [--max-steps 0] [--threads-per-worker 1] [--seed 0]
        [--data-dir /usr/share/datasets/fashion-mnist] [--compile]

The work, so that another implementation can do the same:
  data       the gzipped IDX files of --data-dir (train-*, t10k-*), read here; pixels / 255, then
             standardised with mean 0.2860 and std 0.3530; each worker reads the whole train split
  model      cnn: Conv(1->32, 3x3, pad 1) ReLU MaxPool(2), Conv(32->64, 3x3, pad 1) ReLU MaxPool(2),
             Linear(3136, 128) ReLU Dropout(0.25) Linear(128, 10);
             mlp (Ray Train's Fashion-MNIST tutorial): Linear(784, 256) BatchNorm1d ReLU Dropout(0.3)
             Linear(256, 10)
  training   DDP over N spawned workers, Adam(lr 1e-3), cross-entropy, the global batch split evenly
             over the workers, DistributedSampler(shuffle, seed 0), torch.manual_seed(--seed)
  evaluation rank 0, the whole t10k split in batches of 1,000 (eager, in both modes)

One JSON line ends the run: final_train_loss (the ranks' last losses, averaged),
mean_train_loss_last50 (each rank's last 50 losses, averaged), test_accuracy, eval_s, the timing
of benchmarks/peers/common.py, the configuration, "mode" (eager or compile) and "torch".
"""
import time

START = time.time()  # before the heavy imports: startup_s and wall_s count them

import gzip  # noqa: E402
import os  # noqa: E402
import struct  # noqa: E402

import common  # noqa: E402  (sets the thread variables before torch loads)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530
FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
         "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


def read_idx(path):
    """An unsigned-byte IDX file (gzipped) as a numpy array of its shape."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise common.UserError("cannot read %s: %s" % (path, e))
    if len(raw) < 4:
        raise common.UserError("%s: too short for an IDX file" % path)
    zero, kind, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or kind != 0x08 or len(raw) < 4 + 4 * ndim:
        raise common.UserError("%s: not an unsigned-byte IDX file" % path)
    shape = struct.unpack(">%dI" % ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise common.UserError("%s: %d bytes of data for the shape %s" % (path, data.size, shape))
    return data.reshape(shape)


def load(data_dir, split):
    """(images N x 1 x 28 x 28, standardised; labels N) of one split."""
    images, labels = (read_idx(os.path.join(data_dir, name)) for name in FILES[split])
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise common.UserError("%s: the %s images and labels do not match" % (data_dir, split))
    x = (images.astype(np.float32) / 255.0 - MEAN) / STD
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def build_model(name):
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10))
    return nn.Sequential(
        nn.Flatten(), nn.Linear(28 * 28, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Dropout(0.3), nn.Linear(256, 10))


def worker(rank, args):
    world = args.workers
    torch.manual_seed(args.seed)
    train = TensorDataset(*load(args.data_dir, "train"))
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.global_batch // world, sampler=sampler)
    model, net = common.distribute(build_model(args.model), args.compile)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()

    def step(batch):
        x, y = batch
        return criterion(model(x), y), len(y)

    model.train()
    loop = common.Loop(START)
    loop.train(args, optimizer, loader, sampler, step)
    samples, final_loss, recent_loss = loop.totals()
    if rank != 0:
        return None

    t0 = time.time()
    x_test, y_test = load(args.data_dir, "test")
    net.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x_test), 1000):
            correct += int((net(x_test[i:i + 1000]).argmax(1) == y_test[i:i + 1000]).sum())
    result = {"model": args.model, "workers": world, "global_batch": args.global_batch,
              "per_worker_batch": args.global_batch // world, "threads_per_worker": args.threads_per_worker,
              "epochs": args.epochs, "max_steps": args.max_steps or None,
              "final_train_loss": round(final_loss, 5), "mean_train_loss_last50": round(recent_loss, 5),
              "test_accuracy": round(correct / len(x_test), 4), "eval_s": round(time.time() - t0, 3),
              "numpy": np.__version__}
    result.update(loop.timing(samples))
    return result


def main():
    p = common.parser(__doc__, workers=1, global_batch=128)
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    p.add_argument("--data-dir", default=DEFAULT_DATA, help="the IDX files (default %(default)s)")
    args = p.parse_args()
    common.check(p, args)
    missing = [n for names in FILES.values() for n in names if not os.path.isfile(os.path.join(args.data_dir, n))]
    if missing:
        common.fail("fashion_mnist.py", "--data-dir %s lacks %s (Debian's dataset-fashion-mnist package installs "
                    "the files in %s)" % (args.data_dir, ", ".join(missing), DEFAULT_DATA))
    common.emit(common.run(worker, args, START))


if __name__ == "__main__":
    main()
