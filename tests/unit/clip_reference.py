# SPDX-License-Identifier: Apache-2.0
"""The Python side of dtrain's CLIP tests (tests/unit/clip_test.cpp), run with the environment of
scripts/python-env (torch, transformers, safetensors). No downloads: the model is made here.

    clip_reference.py make DIR     a small CLIPModel with seeded random weights (text: vocabulary 99,
                                   16 positions, eos 98; vision: image 30, patch 6; both hidden 32,
                                   2 layers, 4 heads, intermediate 37; projection 24) by
                                   save_pretrained: DIR/clip, and its towers alone: DIR/vision
                                   (CLIPVisionModel), DIR/text (CLIPTextModel); DIR/reference.safetensors:
                                   pixel_values [3, 3, 30, 30], input_ids and attention_mask [3, 7]
                                   (rows padded after their EOS, one row unpadded, one with an EOS
                                   before the padding's), and, in fp32 eval mode, image_embeds,
                                   text_embeds (get_*_features), logits_per_image, and both towers'
                                   last_hidden_state and pooler_output
                                   DIR/processor (a CLIPImageProcessor: shortest edge 30, crop 30,
                                   the model's input), DIR/grow (shortest edge 64, crop 56 x 48);
                                   DIR/images: vit_reference.py's image files and a huge one
                                   (1600 x 1200)
    clip_reference.py process CONFIG_DIR FILE
    clip_reference.py compare CONFIG_DIR FILE PIL_LEVELS AUTO_LEVELS
                                   vit_reference.py's commands of the same names, for the
                                   CLIPImageProcessor of CONFIG_DIR (the PIL backend,
                                   CLIPImageProcessorPil, and AutoImageProcessor's default)
    clip_reference.py check DIR FILE
                                   loads DIR with transformers' CLIPModel.from_pretrained (any
                                   missing or unexpected key fails), computes get_image_features and
                                   get_text_features of FILE's inputs and compares them with FILE's
                                   image_embeds and text_embeds

Each command prints every check with its largest absolute difference, then "N checks, M failed", and
exits 1 when M > 0 or N == 0.
"""

import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vit_reference  # noqa: E402 (its Checks, image files and processor checks)

TOLERANCE = 1e-5


def config():
    from transformers import CLIPConfig
    tower = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, projection_dim=24)
    return CLIPConfig(
        text_config=dict(tower, vocab_size=99, max_position_embeddings=16, pad_token_id=1, bos_token_id=97, eos_token_id=98),
        vision_config=dict(tower, image_size=30, patch_size=6, num_channels=3),
        projection_dim=24)


def features(out):
    """get_*_features' tensor: transformers 5 returns the tower's output with the projection as pooler_output."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def make(d):
    from transformers import CLIPModel, CLIPTextModel, CLIPVisionModel
    torch.manual_seed(0)
    model = CLIPModel(config()).eval()
    with torch.no_grad():  # non-trivial norms and logit_scale, so that a name mix-up cannot hide
        for name, p in model.named_parameters():
            if "norm" in name or name == "logit_scale":
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(f"{d}/clip")
    # transformers 5's towers are CLIPModel's own submodules (names without a prefix).
    vision = CLIPVisionModel(model.config.vision_config).eval()
    vision.load_state_dict(model.vision_model.state_dict())
    vision.save_pretrained(f"{d}/vision")
    text = CLIPTextModel(model.config.text_config).eval()
    text.load_state_dict(model.text_model.state_dict())
    text.save_pretrained(f"{d}/text")

    pixel_values = torch.randn(3, 3, 30, 30)
    input_ids = torch.tensor([[97, 5, 17, 42, 98, 1, 1],    # padded after its EOS
                              [97, 60, 61, 62, 63, 64, 98],  # no padding
                              [97, 98, 1, 1, 1, 1, 1]])      # the shortest
    attention_mask = (torch.arange(7)[None, :] <= (input_ids == 98).int().argmax(-1)[:, None]).long()
    with torch.no_grad():
        out = model(input_ids=input_ids, pixel_values=pixel_values, attention_mask=attention_mask)
        v = model.vision_model(pixel_values=pixel_values)
        t = model.text_model(input_ids=input_ids, attention_mask=attention_mask)
        tensors = {
            "pixel_values": pixel_values, "input_ids": input_ids, "attention_mask": attention_mask,
            "image_embeds": features(model.get_image_features(pixel_values=pixel_values)),
            "text_embeds": features(model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)),
            "logits_per_image": out.logits_per_image,
            "vision_last_hidden_state": v.last_hidden_state, "vision_pooler_output": v.pooler_output,
            "text_last_hidden_state": t.last_hidden_state, "text_pooler_output": t.pooler_output,
        }
    save_file({k: x.contiguous() for k, x in tensors.items()}, f"{d}/reference.safetensors")

    from PIL import Image
    from transformers import CLIPImageProcessorPil
    CLIPImageProcessorPil(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30}).save_pretrained(f"{d}/processor")
    CLIPImageProcessorPil(size={"shortest_edge": 64}, crop_size={"height": 56, "width": 48}).save_pretrained(f"{d}/grow")
    g = vit_reference.make_images(d)
    ys, xs = torch.meshgrid(torch.arange(1200), torch.arange(1600), indexing="ij")
    planes = torch.stack([(xs * 255 // 1599), (ys * 255 // 1199), ((xs + ys) * 7) % 256]).permute(1, 2, 0)
    pixels = (planes + torch.randint(-40, 41, planes.shape, generator=g)).clamp(0, 255).to(torch.uint8).numpy()
    Image.fromarray(pixels, "RGB").save(f"{d}/images/huge.png")
    print(f"made {d}: clip, vision, text, reference.safetensors, processor, grow, images")
    return 0


def check(model_dir, file):
    from transformers import CLIPModel
    checks = vit_reference.Checks()
    model, info = CLIPModel.from_pretrained(model_dir, output_loading_info=True)
    model.eval()
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        checks.result(f"load {kind}", not info.get(kind), str(sorted(info.get(kind) or [])))
    t = load_file(file)
    with torch.no_grad():
        checks.close(TOLERANCE, "image_embeds", features(model.get_image_features(pixel_values=t["pixel_values"])),
                     t["image_embeds"])
        checks.close(TOLERANCE, "text_embeds",
                     features(model.get_text_features(input_ids=t["input_ids"], attention_mask=t["attention_mask"])),
                     t["text_embeds"])
    return checks.exit()


def process(config_dir, file):
    from transformers import CLIPImageProcessorPil
    return vit_reference.process(config_dir, file, pil_class=CLIPImageProcessorPil)


def compare(config_dir, file, pil_levels, auto_levels):
    from transformers import CLIPImageProcessorPil
    return vit_reference.compare(config_dir, file, float(pil_levels), float(auto_levels), pil_class=CLIPImageProcessorPil)


if __name__ == "__main__":
    commands = {"make": (make, 1), "check": (check, 2), "process": (process, 2), "compare": (compare, 4)}
    if len(sys.argv) < 2 or sys.argv[1] not in commands or len(sys.argv) != 2 + commands[sys.argv[1]][1]:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    f, _ = commands[sys.argv[1]]
    sys.exit(f(*sys.argv[2:]))
