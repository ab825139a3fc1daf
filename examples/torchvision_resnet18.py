#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""torchvision's resnet18 with the small-image stem, the network of examples/image_classifier: saves
its state_dict (random weights) as a user exports one for image_classifier --weights to start from,
or evaluates what image_classifier trained.

    torchvision_resnet18.py OUT.pt|OUT.safetensors [--channels 1|3] [--classes N] [--headless] [--seed N]
    torchvision_resnet18.py --evaluate RUN_DIR --root DIR [--mean X] [--std X]

The network: torchvision.models.resnet18(num_classes=N) whose conv1 becomes a 3x3 stride-1
convolution over --channels and whose maxpool becomes nn.Identity(), as torchvision users adapt it
to 32x32 images. Saving: torch.manual_seed(--seed) first; --headless leaves fc.weight and fc.bias out
of the file (a backbone whose classifier the fine-tuning run trains from scratch); prints the number
of tensors saved. --evaluate loads the latest checkpoint's model.pt of image_classifier's RUN_DIR
(--storage-path/--name) strictly into that network (channels and classes read from its shapes),
evaluates it on DIR/test as the example does (ToTensor, Normalize(--mean, --std)) and prints one JSON
line: the tensors loaded, torchvision's test accuracy and mean cross-entropy loss, the example's
(RUN_DIR/metrics.jsonl's last test_accuracy and test_loss), and their differences (the loss's relative).
"""
import argparse
import glob
import json
import os

import torch
import torchvision
from torch import nn


def small_resnet18(channels, classes):
    m = torchvision.models.resnet18(num_classes=classes)
    m.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    m.maxpool = nn.Identity()
    return m


def evaluate(args):
    checkpoint = sorted(glob.glob(os.path.join(args.evaluate, "checkpoint_*", "model.pt")))[-1]
    state = torch.load(checkpoint, weights_only=True)
    channels, classes = state["conv1.weight"].shape[1], state["fc.weight"].shape[0]
    model = small_resnet18(channels, classes)
    model.load_state_dict(state, strict=True)  # raises on a missing or unexpected key
    model.eval()
    mode = "L" if channels == 1 else "RGB"
    norm = torchvision.transforms.Normalize([args.mean] * channels, [args.std] * channels)
    test = torchvision.datasets.ImageFolder(
        os.path.join(args.root, "test"), loader=lambda p: torchvision.datasets.folder.pil_loader(p).convert(mode),
        transform=torchvision.transforms.Compose([torchvision.transforms.ToTensor(), norm]))
    right, loss = 0, 0.0
    with torch.no_grad():
        for x, y in torch.utils.data.DataLoader(test, batch_size=256):
            logits = model(x)
            right += (logits.argmax(1) == y).sum().item()
            loss += nn.functional.cross_entropy(logits, y, reduction="sum").item()
    with open(os.path.join(args.evaluate, "metrics.jsonl")) as f:
        theirs = [json.loads(line) for line in f if line.strip()][-1]
    accuracy, loss = right / len(test), loss / len(test)
    print(json.dumps({"checkpoint": checkpoint, "tensors": len(state), "torchvision_test_accuracy": accuracy,
                      "dtrain_test_accuracy": theirs["test_accuracy"], "torchvision_test_loss": loss,
                      "dtrain_test_loss": theirs["test_loss"], "accuracy_diff": abs(accuracy - theirs["test_accuracy"]),
                      "loss_relative_diff": abs(loss - theirs["test_loss"]) / max(abs(loss), 1e-12)}))


p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("out", nargs="?")
p.add_argument("--channels", type=int, choices=[1, 3], default=1)
p.add_argument("--classes", type=int, default=10)
p.add_argument("--headless", action="store_true")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--evaluate", metavar="RUN_DIR")
p.add_argument("--root")
p.add_argument("--mean", type=float, default=0.2860)
p.add_argument("--std", type=float, default=0.3530)
args = p.parse_args()
if args.evaluate:
    if not args.root:
        p.error("--evaluate needs --root DIR (the image folder the run trained on)")
    evaluate(args)
    raise SystemExit(0)
if not args.out:
    p.error("OUT.pt or OUT.safetensors is required (or --evaluate RUN_DIR)")
torch.manual_seed(args.seed)
m = small_resnet18(args.channels, args.classes)
state = m.state_dict()
if args.headless:
    del state["fc.weight"], state["fc.bias"]
if args.out.endswith(".safetensors"):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in state.items()}, args.out)
else:
    torch.save(state, args.out)
print(len(state))
