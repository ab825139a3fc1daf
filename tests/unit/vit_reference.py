# SPDX-License-Identifier: Apache-2.0
"""The Python side of dtrain's ViT tests (tests/unit/vit_test.cpp), run with the environment of
scripts/python-env (torch, transformers, safetensors, Pillow). No downloads: the model is made here.

    vit_reference.py make DIR            a small ViTForImageClassification with seeded random weights
                                         (image 32, patch 8, hidden 64, 2 layers, 4 heads, 3 named
                                         labels) by save_pretrained: DIR/cls (with a
                                         preprocessor_config.json), DIR/base (a bare ViTModel, with its
                                         pooler); DIR/shrink/preprocessor_config.json (20 x 24: every
                                         test image shrinks); DIR/reference.safetensors: pixel_values
                                         [3, 3, 32, 32] and, in fp32 eval mode, the classifier's logits
                                         and last_hidden_state, and the bare model's last_hidden_state;
                                         DIR/images: colour PNGs (RGB 50 x 37, RGBA 64 x 40, RGB 9 x 7)
                                         and the kinds of file a user has: portrait RGB and RGBA,
                                         grey (L), palette (P), a CMYK JPEG, a tall strip, a large one
    vit_reference.py check MODEL_DIR FILE
                                         loads MODEL_DIR with transformers'
                                         ViTForImageClassification.from_pretrained, runs it in fp32
                                         eval mode on FILE's pixel_values and compares its logits with
                                         FILE's; FILE's metadata "id2label" (JSON) is compared with the
                                         loaded config
    vit_reference.py compare CONFIG_DIR FILE PIL_LEVELS AUTO_LEVELS
                                         the pixel_values of FILE (as process) against the PIL backend
                                         and against what AutoImageProcessor.from_pretrained(CONFIG_DIR)
                                         gives a transformers 5 user (its default, torchvision, backend),
                                         in grey levels (the normalised difference times std * 255):
                                         each image's largest, checked against PIL_LEVELS and AUTO_LEVELS
    vit_reference.py process CONFIG_DIR FILE
                                         runs transformers' ViTImageProcessor (the PIL backend) of
                                         CONFIG_DIR on each image file FILE's metadata "files" names
                                         (opened with PIL, convert("RGB")) and compares the
                                         pixel_values with FILE's

Each command prints every check with its largest absolute difference, then "N checks, M failed", and
exits 1 when M > 0 or N == 0. A missing, unexpected or mismatched key of a load fails its check.
"""

import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

TOLERANCE = 1e-5
LABELS = ["cat", "dog", "bird"]


class Checks:
    def __init__(self):
        self.checks = self.failed = 0

    def result(self, name, ok, detail):
        self.checks += 1
        self.failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")

    def close(self, tolerance, name, ours, theirs):
        gap = (ours.double() - theirs.double()).abs()
        diff = gap.max().item() if gap.numel() else 0.0
        self.result(name, ours.shape == theirs.shape and diff <= tolerance,
                    f"shape {list(ours.shape)}, largest absolute difference {diff:.3g} (tolerance {tolerance}; "
                    f"largest value {theirs.abs().max().item():.3g})")

    def exit(self):
        print(f"{self.checks} checks, {self.failed} failed")
        return 1 if self.failed or not self.checks else 0


def processor_class():
    try:
        from transformers import ViTImageProcessorPil  # the PIL backend, without torchvision's warning
        return ViTImageProcessorPil
    except ImportError:
        from transformers import ViTImageProcessor
        return ViTImageProcessor


def make(d):
    from transformers import ViTConfig, ViTForImageClassification, ViTModel

    config = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=128, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                       id2label=dict(enumerate(LABELS)), label2id={l: i for i, l in enumerate(LABELS)})
    torch.manual_seed(27)
    cls = ViTForImageClassification(config).eval()
    base = ViTModel(config).eval()  # add_pooling_layer=True: its file holds pooler.dense
    with torch.no_grad():  # weights of their own, larger than the initialiser's (zero biases, unit norms)
        for model in (cls, base):
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    cls.save_pretrained(os.path.join(d, "cls"))
    base.save_pretrained(os.path.join(d, "base"))
    processor = processor_class()(size={"height": 32, "width": 32}, image_mean=[0.485, 0.456, 0.406],
                                  image_std=[0.229, 0.224, 0.225])
    processor.save_pretrained(os.path.join(d, "cls"))
    shrink = processor_class()(size={"height": 20, "width": 24})
    shrink.save_pretrained(os.path.join(d, "shrink"))

    pixel_values = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = cls(pixel_values, output_hidden_states=True)
        tensors = {"pixel_values": pixel_values, "logits": out.logits,
                   "last_hidden_state": cls.vit(pixel_values).last_hidden_state,
                   "base_last_hidden_state": base(pixel_values).last_hidden_state}
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "reference.safetensors"))
    make_images(d)
    print(f"made {d}: cls, base, shrink, reference.safetensors, images")
    return 0


def make_images(d):
    """DIR/images: the image files of the processor tests (see make above)."""
    from PIL import Image

    images = os.path.join(d, "images")
    os.makedirs(images, exist_ok=True)
    g = torch.Generator().manual_seed(9)
    for name, mode, (w, h) in (("rgb.png", "RGB", (50, 37)), ("rgba.png", "RGBA", (64, 40)), ("small.png", "RGB", (9, 7))):
        channels = len(mode)
        # smooth gradients plus noise: shrinking and growing both have something to average
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        base_img = torch.stack([(xs * 255 // max(w - 1, 1)), (ys * 255 // max(h - 1, 1)), ((xs + ys) * 7) % 256,
                                torch.full_like(xs, 200)])[:channels].permute(1, 2, 0)
        noise = torch.randint(-40, 41, base_img.shape, generator=g)
        pixels = (base_img + noise).clamp(0, 255).to(torch.uint8).numpy()
        Image.fromarray(pixels, mode).save(os.path.join(images, name))
    # The kinds of file a user has (issue 49): taller than wide, grey, palette, CMYK, a strip, a large one.
    for name, mode, (w, h) in (("portrait.png", "RGB", (37, 50)), ("portrait_rgba.png", "RGBA", (30, 44)),
                               ("grey.png", "L", (41, 30)), ("palette.png", "P", (45, 33)), ("cmyk.jpg", "CMYK", (48, 36)),
                               ("strip.png", "RGB", (20, 90)), ("large.png", "RGB", (333, 250))):
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        planes = torch.stack([(xs * 255 // max(w - 1, 1)), (ys * 255 // max(h - 1, 1)), ((xs + ys) * 7) % 256,
                              torch.full_like(xs, 120)]).permute(1, 2, 0)
        noise = torch.randint(-40, 41, planes.shape, generator=g)
        pixels = (planes + noise).clamp(0, 255).to(torch.uint8).numpy()
        if mode == "L":
            image = Image.fromarray(pixels[:, :, 0], "L")
        elif mode == "P":
            image = Image.fromarray(pixels[:, :, :3], "RGB").quantize(colors=64)
        else:
            image = Image.fromarray(pixels[:, :, :len(mode)], mode)
        image.save(os.path.join(images, name), **({"quality": 95} if name.endswith(".jpg") else {}))
    return g


def check(model_dir, path):
    from transformers import ViTForImageClassification

    c = Checks()
    model, info = ViTForImageClassification.from_pretrained(model_dir, output_loading_info=True)
    model.eval()
    for what in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        found = list(info.get(what, []))
        c.result(f"load {what}", not found, found or "none")
    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
        pixel_values, logits = f.get_tensor("pixel_values"), f.get_tensor("logits")
    if "id2label" in meta:
        theirs = {int(k): v for k, v in model.config.id2label.items()}
        ours = {int(k): v for k, v in json.loads(meta["id2label"]).items()}
        c.result("id2label", ours == theirs, f"ours {ours}, transformers' {theirs}")
    with torch.no_grad():
        out = model(pixel_values.float()).logits
    c.close(TOLERANCE, "logits", logits, out)
    c.result("predicted labels", torch.equal(logits.argmax(-1), out.argmax(-1)),
             f"ours {logits.argmax(-1).tolist()}, transformers' {out.argmax(-1).tolist()}")
    return c.exit()


def process(config_dir, path, pil_class=None):
    from PIL import Image

    c = Checks()
    processor = (pil_class or processor_class()).from_pretrained(config_dir)
    with safe_open(path, "pt") as f:
        files = json.loads(f.metadata()["files"])
        ours = f.get_tensor("pixel_values")
    c.result("files", len(files) == ours.shape[0], f"{len(files)} files, {ours.shape[0]} images")
    for i, name in enumerate(files):
        with Image.open(name) as im:
            theirs = processor(im.convert("RGB"), return_tensors="pt")["pixel_values"][0]
        c.close(TOLERANCE, os.path.basename(os.path.dirname(name)) + "/" + os.path.basename(name), ours[i], theirs)
    return c.exit()


def compare(config_dir, path, pil_levels, auto_levels, pil_class=None):
    from PIL import Image
    from transformers import AutoImageProcessor

    c = Checks()
    pil = (pil_class or processor_class()).from_pretrained(config_dir)
    auto = AutoImageProcessor.from_pretrained(config_dir)
    std = torch.tensor(pil.image_std).view(3, 1, 1)
    with safe_open(path, "pt") as f:
        files = json.loads(f.metadata()["files"])
        ours = f.get_tensor("pixel_values")
    print(f"AutoImageProcessor gives {type(auto).__name__}; the PIL backend is {type(pil).__name__}")
    worst = {"pil": 0.0, "auto": 0.0}
    for i, name in enumerate(files):
        with Image.open(name) as im:
            mode, size = im.mode, im.size
            rgb = im.convert("RGB")
        levels = {}
        for backend, processor in (("pil", pil), ("auto", auto)):
            theirs = processor(rgb, return_tensors="pt")["pixel_values"][0]
            levels[backend] = round(((ours[i] - theirs).abs() * std * 255).max().item(), 3)
            worst[backend] = max(worst[backend], levels[backend])
        print(f"{os.path.basename(name)} ({mode} {size[0]}x{size[1]}): PIL backend {levels['pil']} levels, "
              f"AutoImageProcessor {levels['auto']} levels")
    c.result(f"PIL backend: largest {worst['pil']} grey levels, at most {pil_levels}", worst["pil"] <= pil_levels,
             worst["pil"])
    c.result(f"AutoImageProcessor: largest {worst['auto']} grey levels, at most {auto_levels}",
             worst["auto"] <= auto_levels, worst["auto"])
    return c.exit()


def main(argv):
    if len(argv) == 3 and argv[1] == "make":
        return make(argv[2])
    if len(argv) == 4 and argv[1] == "check":
        return check(argv[2], argv[3])
    if len(argv) == 6 and argv[1] == "compare":
        return compare(argv[2], argv[3], float(argv[4]), float(argv[5]))
    if len(argv) == 4 and argv[1] == "process":
        return process(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
