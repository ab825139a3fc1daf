# SPDX-License-Identifier: Apache-2.0
"""Makes what examples/dog_breeds.cpp and benchmarks/clip_peer.py read, with nothing downloaded:

    make_dog_breeds.py OUT [--breeds N] [--per-class N] [--geometry small|vit-b-32] [--seed N]

OUT/model: a CLIPModel with seeded random weights saved by transformers (config.json,
model.safetensors) and its CLIPImageProcessor (preprocessor_config.json): --geometry small is a
tiny CLIP (image 32, patch 8, hidden 32, 2 layers, projection 16) for tests, vit-b-32 is
openai/clip-vit-base-patch32's geometry (image 224, patch 32, hidden 768, 12 layers, projection
512) for the benchmark. OUT/images/{train,val,test}/<breed>/<n>.{png,jpg}: per breed a colour and
a stripe pattern with noise, of varied sizes (portrait, landscape, tiny, large) and kinds (RGB,
RGBA, grey, palette, JPEG), --per-class files a split (train: 4x that). Run with the venv's Python
(scripts/python-env: torch, transformers, Pillow).
"""

import argparse
import os
import random

import numpy as np
import torch
from PIL import Image


def model(out, geometry, seed):
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel
    if geometry == "small":
        tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
        config = CLIPConfig(text_config=dict(tower, vocab_size=100, max_position_embeddings=16, eos_token_id=99),
                            vision_config=dict(tower, image_size=32, patch_size=8), projection_dim=16)
        size = 32
    else:  # transformers' defaults are ViT-B/32's
        config, size = CLIPConfig(), 224
    torch.manual_seed(seed)
    CLIPModel(config).save_pretrained(out)
    CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size}).save_pretrained(out)


def images(out, breeds, per_class, seed):
    rng = random.Random(seed)
    shapes = [(64, 48), (48, 64), (23, 17), (160, 120), (40, 90)]
    kinds = ["RGB", "RGB", "RGBA", "L", "P", "JPEG"]
    for split, count in (("train", 4 * per_class), ("val", per_class), ("test", per_class)):
        for b in range(breeds):
            d = os.path.join(out, split, f"breed_{b:02d}")
            os.makedirs(d, exist_ok=True)
            colour = np.array([(b * 97) % 256, (b * 57 + 80) % 256, (b * 31 + 160) % 256], dtype=np.float64)
            for n in range(count):
                w, h = rng.choice(shapes)
                ys, xs = np.mgrid[0:h, 0:w]
                stripes = ((xs * (b % 3 + 1) + ys * (b // 3 + 1)) // 6) % 2  # the breed's pattern
                img = colour[None, None, :] * (0.6 + 0.4 * stripes[..., None])
                img += np.array([rng.gauss(0, 25) for _ in range(h * w * 3)]).reshape(h, w, 3)
                pixels = np.clip(img, 0, 255).astype(np.uint8)
                kind = rng.choice(kinds)
                name = os.path.join(d, f"{n:04d}")
                if kind == "JPEG":
                    Image.fromarray(pixels, "RGB").save(name + ".jpg", quality=90)
                elif kind == "RGBA":
                    alpha = np.full((h, w, 1), 200, dtype=np.uint8)
                    Image.fromarray(np.concatenate([pixels, alpha], -1), "RGBA").save(name + ".png")
                elif kind == "L":
                    Image.fromarray(pixels, "RGB").convert("L").save(name + ".png")
                elif kind == "P":
                    Image.fromarray(pixels, "RGB").quantize(colors=64).save(name + ".png")
                else:
                    Image.fromarray(pixels, "RGB").save(name + ".png")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--breeds", type=int, default=5)
    p.add_argument("--per-class", type=int, default=4)
    p.add_argument("--geometry", choices=["small", "vit-b-32"], default="small")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.breeds < 2 or a.per_class < 1:
        p.error("--breeds needs 2 or more and --per-class 1 or more")
    model(os.path.join(a.out, "model"), a.geometry, a.seed)
    images(os.path.join(a.out, "images"), a.breeds, a.per_class, a.seed)
    print(f"make_dog_breeds: {a.out}/model ({a.geometry}), {a.out}/images ({a.breeds} breeds, "
          f"{4 * a.per_class}/{a.per_class}/{a.per_class} files each in train/val/test)")


if __name__ == "__main__":
    main()
