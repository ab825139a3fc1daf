#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Saves the state_dict of torchvision's resnet18 (random weights) with the small-image stem, as a
user exports a network for image_classifier --init to start from.

    torchvision_resnet18.py OUT.pt [--channels 1|3] [--classes N] [--headless] [--seed N]

conv1 becomes a 3x3 stride-1 convolution over --channels, the max-pool is removed (the layout of
examples/resnet.hpp at width 64); --headless leaves fc.weight and fc.bias out of the file (a
backbone whose classifier the fine-tuning run trains from scratch: load it with --init-non-strict).
Prints the number of tensors saved.
"""
import argparse

import torch
import torchvision
from torch import nn

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("out")
p.add_argument("--channels", type=int, choices=[1, 3], default=1)
p.add_argument("--classes", type=int, default=10)
p.add_argument("--headless", action="store_true")
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()
torch.manual_seed(args.seed)
m = torchvision.models.resnet18(num_classes=args.classes)
m.conv1 = nn.Conv2d(args.channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
m.maxpool = nn.Identity()
state = m.state_dict()
if args.headless:
    del state["fc.weight"], state["fc.bias"]
torch.save(state, args.out)
print(len(state))
