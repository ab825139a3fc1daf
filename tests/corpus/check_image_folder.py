#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Runs scripts/make-image-folder on a slice (--per-class) and checks it as a Python user would:
torchvision's ImageFolder finds the classes in label order, PIL decodes every PNG to exactly the
IDX file's pixels, the same command gives byte-identical files, and bad arguments get clear errors.

    check_image_folder.py SCRIPT WORK_DIR
"""
import gzip
import os
import shutil
import subprocess
import sys

import numpy as np
from PIL import Image
from torchvision import datasets

script, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
failed = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failed.append(what)


def make(out, *extra):
    return subprocess.run([script, os.path.join(work, out), *extra], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


r = make("a", "--per-class", "12")
print(r.stdout, r.stderr)
check(r.returncode == 0, "make-image-folder --per-class 12 exits 0")
data = "/usr/share/datasets/fashion-mnist"
for split, prefix in (("train", "train"), ("test", "t10k")):
    with gzip.open(os.path.join(data, prefix + "-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read()[16:], dtype=np.uint8).reshape(-1, 28, 28)
    with gzip.open(os.path.join(data, prefix + "-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read()[8:], dtype=np.uint8)
    folder = datasets.ImageFolder(os.path.join(work, "a", split))
    check(len(folder) == 120, "%s: 10 classes x 12 images: %d" % (split, len(folder)))
    check([folder.class_to_idx[c] for c in folder.classes] == list(range(10)) and folder.classes[0] == "0-t-shirt-top",
          "%s: ImageFolder's sorted classes are the IDX labels: %s" % (split, folder.classes))
    exact = True
    for path, target in folder.samples:
        index = int(os.path.basename(path).split(".")[0])
        img = Image.open(path)
        exact &= img.mode == "L" and img.size == (28, 28) and labels[index] == target
        exact &= np.array_equal(np.asarray(img), images[index])
    check(exact, "%s: every PNG decodes (PIL) to its IDX pixels, in the folder of its label" % split)
    first = sorted(int(os.path.basename(p).split(".")[0]) for p, t in folder.samples if t == 0)
    check(first == [i for i in range(len(labels)) if labels[i] == 0][:12], "%s: the first 12 of each class" % split)

r = make("b", "--per-class", "12")
same = all(open(os.path.join(root, n), "rb").read() ==
           open(os.path.join(root.replace(os.path.join(work, "a"), os.path.join(work, "b")), n), "rb").read()
           for root, _, names in os.walk(os.path.join(work, "a")) for n in names if n.endswith(".png"))
check(r.returncode == 0 and same, "the same command writes byte-identical PNGs")

for args, message in [(["--per-class", "-1"], "--per-class must be >= 0"),
                      (["--data", os.path.join(work, "nowhere")], "cannot read")]:
    r = make("bad", *args)
    check(r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr,
          "%s: a clear error naming %r: %s" % (" ".join(args), message, r.stderr.strip()))
sys.exit(1 if failed else 0)
