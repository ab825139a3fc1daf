#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""What PIL and torchvision make of a few images, for image_folder_test.cpp to compare with.

    image_reference.py OUT_DIR

Writes images of every kind the C++ side reads (grey, RGB, RGBA, palette, grey+alpha PNG, and
16-bit grey, grey+alpha, RGB and RGBA PNGs; grey and colour JPEG) under OUT_DIR/images, and under OUT_DIR/ref the raw bytes of:
  - PIL's Image.open(f).convert("L" | "RGB") of each (uint8, rows x cols x channels);
  - torchvision.transforms.Resize(size) of the converted PIL image (PIL's bilinear), and of the
    same as a uint8 tensor with antialias=True;
  - ToTensor() + Normalize(mean, std) of the RGB image (float32, C x H x W);
and an image folder (OUT_DIR/folder: nested directories, upper-case extensions, a file that is
not an image by its name) with torchvision's ImageFolder's classes and samples. All of it is
listed in OUT_DIR/manifest.json.
"""
import json
import os
import struct
import sys
import zlib

import numpy as np
import torch
from PIL import Image
from torchvision import datasets, transforms
from torchvision.transforms import functional as F


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(7)
    os.makedirs(os.path.join(out, "images"), exist_ok=True)
    os.makedirs(os.path.join(out, "ref"), exist_ok=True)
    entries, resizes = [], []

    def save_ref(name, array):
        path = os.path.join(out, "ref", name)
        with open(path, "wb") as f:
            f.write(np.ascontiguousarray(array).tobytes())
        return path

    # Smooth gradients plus noise: JPEG keeps them close, and resizing has edges to blur.
    def picture(h, w, c):
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x * 7 + y * 3 + 40 * k) % 256 for k in range(c)], axis=-1)
        return np.clip(base + rng.integers(-30, 31, size=(h, w, c)), 0, 255).astype(np.uint8)

    images = {
        "grey.png": Image.fromarray(picture(37, 23, 1)[:, :, 0], "L"),
        "rgb.png": Image.fromarray(picture(29, 31, 3), "RGB"),
        "rgba.png": Image.fromarray(picture(17, 19, 4), "RGBA"),
        "grey_alpha.png": Image.fromarray(picture(15, 14, 2), "LA"),
        "palette.png": Image.fromarray(picture(21, 18, 3), "RGB").convert("P", palette=Image.ADAPTIVE, colors=37),
        "grey.jpg": Image.fromarray(picture(33, 40, 1)[:, :, 0], "L"),
        "rgb.jpg": Image.fromarray(picture(35, 42, 3), "RGB"),
    }
    for name, im in images.items():
        path = os.path.join(out, "images", name)
        if name.endswith(".jpg"):
            im.save(path, quality=90)
        else:
            im.save(path)
        for mode in ("L", "RGB"):
            with open(path, "rb") as f:
                converted = Image.open(f).convert(mode)
            a = np.asarray(converted)
            entries.append({"file": path, "channels": 1 if mode == "L" else 3, "shape": list(a.shape[:2]),
                            "ref": save_ref("%s.%s.bin" % (name, mode), a)})
            if name not in ("grey.png", "rgb.png"):
                continue
            for size in ([13, 11], [7, 5], [50, 61], [29, 9], 20):
                pil = np.asarray(transforms.Resize(size)(converted))
                t = F.pil_to_tensor(converted)
                tensor = F.resize(t, size, interpolation=transforms.InterpolationMode.BILINEAR, antialias=True)
                tag = "%s.%s.%s" % (name, mode, "x".join(map(str, size)) if isinstance(size, list) else size)
                resizes.append({"file": path, "channels": 1 if mode == "L" else 3,
                                "size": size if isinstance(size, list) else [size],
                                "shape": list(pil.shape[:2]), "pil": save_ref(tag + ".pil.bin", pil),
                                "tensor": save_ref(tag + ".tensor.bin", tensor.permute(1, 2, 0).numpy())})

    # 16-bit PNGs of each colour type, written here (PIL writes 16-bit grey only): grey with values
    # on both sides of 255 (PIL clips), grey+alpha, RGB and RGBA over the whole range (PIL keeps
    # the high byte).
    def png16(path, samples, colour_type):
        h, w = samples.shape[:2]
        rows = b"".join(b"\x00" + samples[y].astype(">u2").tobytes() for y in range(h))

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, colour_type, 0, 0, 0)) +
                    chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))

    wide = {
        "grey16.png": (rng.integers(0, 600, size=(13, 17)), 0),
        "grey_alpha16.png": (rng.integers(0, 65536, size=(11, 9, 2)), 4),
        "rgb16.png": (rng.integers(0, 65536, size=(12, 15, 3)), 2),
        "rgba16.png": (rng.integers(0, 65536, size=(10, 7, 4)), 6),
    }
    for name, (samples, colour_type) in wide.items():
        path = os.path.join(out, "images", name)
        png16(path, samples.astype(np.uint16), colour_type)
        for mode in ("L", "RGB"):
            with open(path, "rb") as f:
                a = np.asarray(Image.open(f).convert(mode))
            entries.append({"file": path, "channels": 1 if mode == "L" else 3, "shape": list(a.shape[:2]),
                            "ref": save_ref("%s.%s.bin" % (name, mode), a)})

    mean, std = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
    with open(os.path.join(out, "images", "rgb.png"), "rb") as f:
        rgb = Image.open(f).convert("RGB")
    normalised = transforms.Normalize(mean, std)(transforms.ToTensor()(rgb))
    assert normalised.dtype == torch.float32
    to_tensor = {"file": os.path.join(out, "images", "rgb.png"), "mean": mean, "std": std,
                 "ref": save_ref("rgb.png.normalised.bin", normalised.numpy())}

    # A folder as a user may hand one over: classes with nested sub-directories, upper-case
    # extensions, a stray file without an image extension.
    root = os.path.join(out, "folder")
    layout = {"b-cat/z.png": "grey.png", "b-cat/A.PNG": "grey.png", "b-cat/sub/x.png": "rgb.png",
              "b-cat/sub-y/w.jpg": "rgb.jpg", "b-cat/notes.txt": None, "a-dog/01.jpeg": "grey.jpg",
              "a-dog/10.png": "rgba.png", "a-dog/2.png": "palette.png", "c-owl/deep/er/q.bmp": "rgb.png"}
    for rel, source in layout.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if source is None:
            with open(path, "w") as f:
                f.write("not an image\n")
        else:
            with open(os.path.join(out, "images", source), "rb") as f:
                im = Image.open(f).convert("RGB")
            im.save(path, format="BMP" if rel.endswith(".bmp") else ("JPEG" if "jp" in rel else "PNG"))
    folder = datasets.ImageFolder(root)
    manifest = {"decode": entries, "resize": resizes, "to_tensor": to_tensor,
                "folder": {"root": root, "classes": folder.classes,
                           "samples": [[p, int(c)] for p, c in folder.samples]}}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
