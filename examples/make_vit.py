# SPDX-License-Identifier: Apache-2.0
"""Makes the ViT that examples/finetune_vit and benchmarks/vit_peer.py start from: transformers' own
ViTForImageClassification with seeded random weights (no pretrained ViT can be downloaded here),
saved by save_pretrained with a ViTImageProcessor's preprocessor_config.json.

    tests/tools/venv-python examples/make_vit.py OUT_DIR [--image 32] [--patch 8] [--hidden 128]
        [--layers 4] [--heads 4] [--intermediate 512] [--labels 3] [--seed 27]

OUT_DIR: config.json, model.safetensors and preprocessor_config.json (resize to image x image with
PIL's bilinear filter, rescale 1/255, normalize with mean 0.5 and std 0.5 per RGB channel,
transformers' defaults). The head has --labels outputs (named label_0, ...): fine-tuning on a folder
of another class count builds a new head, as it would from a real checkpoint. Dropout is 0, as in
google/vit-base-patch16-224's config. Prints one line: the directory and the parameter count.
"""
import argparse
import os

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch
from transformers import ViTConfig, ViTForImageClassification

try:
    from transformers import ViTImageProcessorPil as Processor  # the PIL backend, as dtrain computes it
except ImportError:
    from transformers import ViTImageProcessor as Processor


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--image", type=int, default=32)
    p.add_argument("--patch", type=int, default=8)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--labels", type=int, default=3)
    p.add_argument("--seed", type=int, default=27)
    a = p.parse_args()
    if a.image % a.patch or a.hidden % a.heads:
        p.error("--image must be a multiple of --patch and --hidden of --heads")
    labels = {i: "label_%d" % i for i in range(a.labels)}
    config = ViTConfig(image_size=a.image, patch_size=a.patch, hidden_size=a.hidden, num_hidden_layers=a.layers,
                       num_attention_heads=a.heads, intermediate_size=a.intermediate, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0, id2label=labels, label2id={v: k for k, v in labels.items()})
    torch.manual_seed(a.seed)
    model = ViTForImageClassification(config)
    model.save_pretrained(a.out_dir)
    Processor(size={"height": a.image, "width": a.image}).save_pretrained(a.out_dir)
    print("%s: ViTForImageClassification, %d parameters" % (a.out_dir, sum(t.numel() for t in model.parameters())))


if __name__ == "__main__":
    main()
