# SPDX-License-Identifier: Apache-2.0
"""The Python side of dtrain's ResNet tests (tests/unit/resnet_test.cpp), run with the environment of
scripts/python-env (torch, torchvision, safetensors). Nothing is downloaded: the weights are random.

    resnet_reference.py make DIR            for each ARCH of resnet18, resnet34, resnet50 and
                                            resnet18_small (resnet18 with the small-image stem:
                                            conv1 3x3 stride 1, maxpool an nn.Identity()):
                                            torchvision.models.ARCH(num_classes=CLASSES[ARCH]) with
                                            seeded weights, BatchNorm affine parameters drawn at random
                                            (not the initialiser's 1 and 0) and running statistics
                                            averaged over two batches of random images,
                                            saved as DIR/ARCH.pt (torch.save of the state_dict) and
                                            DIR/ARCH.safetensors; DIR/inputs.safetensors holds the
                                            images; DIR/ARCH_reference.safetensors torchvision's
                                            outputs on them: "eval" (eval mode), "train" (train mode,
                                            from the same weights) and "after_train.NAME" (every
                                            buffer after that train-mode forward); "eval64",
                                            "train64" and "after_train64.NAME" the same in fp64
    resnet_reference.py names FILE          every parameter and buffer's name and shape, for
                                            resnet18/34/50/101/152, resnext50_32x4d and
                                            wide_resnet50_2 (num_classes=1000), as JSON
    resnet_reference.py save ARCH FILE      torch.save of torchvision.models.ARCH()'s state_dict (1000
                                            classes, seeded random weights): a stand-in for the
                                            published ImageNet weights (docs/snippets/resnet.cpp)
    resnet_reference.py strict-load ARCH CLASSES FILE
                                            loads FILE (model.pt of a dtrain checkpoint) strictly into
                                            torchvision.models.ARCH(num_classes=CLASSES) and runs it
    resnet_reference.py check ARCH WEIGHTS INPUTS OUTPUTS [ARCH WEIGHTS INPUTS OUTPUTS ...]
                                            loads WEIGHTS (model.pt by torch.load(weights_only=True),
                                            else safetensors) strictly into torchvision's ARCH, runs
                                            INPUTS' "images" through it in eval mode, then in train
                                            mode, and compares with OUTPUTS' "eval", "train" and
                                            "after_train.NAME"; each group of four in turn, in
                                            one process (torch imports once)

`check` prints every check with its largest absolute difference, then "N checks, M failed
(WEIGHTS)" for each group, and exits 1 when M > 0 or N == 0 for any. Tolerance 1e-5 (fp32).
"""

import copy
import json
import sys

import torch
import torchvision
from safetensors.torch import load_file, save_file

TOLERANCE = 1e-5
CLASSES = {"resnet18": 1000, "resnet34": 10, "resnet50": 7, "resnet18_small": 10}
IMAGES = (2, 3, 64, 48)


def build(arch, num_classes=None):
    """torchvision.models.ARCH; ARCH_small: with the small-image stem, as torchvision users make it."""
    small = arch.endswith("_small")
    model = getattr(torchvision.models, arch.removesuffix("_small"))(weights=None, num_classes=num_classes or CLASSES[arch])
    if small:
        model.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = torch.nn.Identity()
    return model


def make(d):
    torch.manual_seed(0)
    images = torch.randn(IMAGES)
    save_file({"images": images}, f"{d}/inputs.safetensors")
    for i, arch in enumerate(CLASSES):
        torch.manual_seed(100 + i)
        model = build(arch)
        norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        # Each block's last BatchNorm (bn2 of a BasicBlock, bn3 of a Bottleneck), small as in a trained
        # ResNet: the residual stream keeps its scale. At weight ~1 it grows block by block and
        # resnet50's fp32 logits are ill-conditioned: torchvision's own fp32 result is then 6e-5
        # from its fp64 one, on the same weights.
        last = [getattr(b, "bn3", b.bn2) for stage in (model.layer1, model.layer2, model.layer3, model.layer4)
                for b in stage]
        with torch.no_grad():
            for m in norms:
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
                m.momentum = None  # a cumulative average over the calibration batches
            for m in last:
                m.weight.uniform_(0.1, 0.4)
            model.train()  # running statistics of the network's own activations, as a trained one has
            for _ in range(2):
                model(torch.randn(IMAGES))
            for m in norms:
                m.momentum = 0.1
                m.num_batches_tracked.fill_(7)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        torch.save(state, f"{d}/{arch}.pt")
        save_file(state, f"{d}/{arch}.safetensors", metadata={"format": "pt"})
        wide = copy.deepcopy(model).double()  # the same network in fp64: dtrain's must equal it closely
        out = {}
        for suffix, net, x in (("", model, images), ("64", wide, images.double())):
            net.eval()
            with torch.no_grad():
                out["eval" + suffix] = net(x)
                net.train()
                out["train" + suffix] = net(x)
            for k, v in net.named_buffers():
                out[f"after_train{suffix}." + k] = v.clone()
        save_file(out, f"{d}/{arch}_reference.safetensors")
        print(f"{arch}: {len(state)} tensors, logits up to {out['eval'].abs().max().item():.3g} (eval), "
              f"{out['train'].abs().max().item():.3g} (train)")
    return 0


def names(path):
    out = {}
    for arch in ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "wide_resnet50_2"):
        out[arch] = [[k, list(v.shape)] for k, v in build(arch, 1000).state_dict().items()]
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"{len(out)} architectures")
    return 0


def save(arch, path):
    torch.manual_seed(27)
    state = build(arch, 1000).state_dict()
    torch.save(state, path)
    print(f"{arch}: {len(state)} tensors saved to {path}")
    return 0


def strict_load(arch, classes, path):
    model = build(arch, int(classes))
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state, strict=True)  # raises on a missing or unexpected key
    model.eval()
    with torch.no_grad():
        logits = model(torch.randn(1, 3, 64, 64))
    print(f"torchvision: {len(state)} tensors loaded strictly into {arch}(num_classes={classes}), "
          f"logits {list(logits.shape)} finite {bool(torch.isfinite(logits).all())}")
    return 0


def check(arch, weights, inputs, outputs):
    checks = failed = 0

    def result(name, ok, detail):
        nonlocal checks, failed
        checks += 1
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {arch} {name}: {detail}")

    def compare(name, ours, theirs):
        if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
            result(name, False, f"dtrain's {ours.dtype} {list(ours.shape)}, torchvision's {theirs.dtype} {list(theirs.shape)}")
            return
        diff = (ours.double() - theirs.double()).abs().max().item() if ours.numel() else 0.0
        result(name, diff <= TOLERANCE, f"largest absolute difference {diff:.3g} (tolerance {TOLERANCE})")

    if weights.endswith(".pt"):
        state = torch.load(weights, weights_only=True)
    else:
        state = load_file(weights)
    expected = load_file(outputs)
    images = load_file(inputs)["images"]
    model = build(arch, expected["eval"].shape[1])
    try:
        model.load_state_dict(state, strict=True)
        result("strict load", True, f"{len(state)} tensors, no missing or unexpected key")
    except RuntimeError as e:
        result("strict load", False, str(e).replace("\n", " "))
        print(f"{checks} checks, {failed} failed ({weights})")
        return 1
    model.eval()
    with torch.no_grad():
        compare("eval logits", model(images), expected["eval"])
        model.train()
        compare("train logits", model(images), expected["train"])
    buffers = dict(model.named_buffers())
    compare_all = [k for k in expected if k.startswith("after_train.")]
    result("buffers after train", len(compare_all) == len(buffers),
           f"{len(compare_all)} in dtrain's file, {len(buffers)} in torchvision's model")
    worst = max(((buffers[k[len("after_train."):]].double() - expected[k].double()).abs().max().item(), k)
                for k in compare_all if k[len("after_train."):] in buffers)
    result("running statistics after train", worst[0] <= TOLERANCE,
           f"largest absolute difference {worst[0]:.3g} at {worst[1]} (tolerance {TOLERANCE})")
    print(f"{checks} checks, {failed} failed ({weights})")
    return 0 if checks and not failed else 1


def main(argv):
    if len(argv) == 3 and argv[1] == "make":
        return make(argv[2])
    if len(argv) == 3 and argv[1] == "names":
        return names(argv[2])
    if len(argv) == 4 and argv[1] == "save":
        return save(argv[2], argv[3])
    if len(argv) == 5 and argv[1] == "strict-load":
        return strict_load(*argv[2:])
    if len(argv) >= 6 and argv[1] == "check" and len(argv) % 4 == 2:  # one process for many files: torch loads once
        return max(check(*argv[i:i + 4]) for i in range(2, len(argv), 4))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
