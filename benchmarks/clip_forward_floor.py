# SPDX-License-Identifier: Apache-2.0
"""The floor under the dog-breed pair (benchmarks/vs_clip_peer.py): what transformers' CLIP image
tower alone costs an image on one thread, with nothing around it (no decoding, no processor, no
training). Prints ONE JSON line.

    tests/tools/venv-python benchmarks/clip_forward_floor.py [--model-dir DIR] [--batch 64]
        [--threads 1] [--repeats 3]

Without --model-dir the model is transformers' default CLIPConfig (openai/clip-vit-base-patch32's
geometry: image 224, patch 32, hidden 768, 12 layers), randomly initialized: the cost of a forward
does not depend on the weights. ms_per_image: the median of --repeats calls of get_image_features
on --batch random images under torch.inference_mode, after one warm-up call.
"""
import argparse
import json
import os
import statistics
import time

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--model-dir", help="a transformers CLIP directory (default: CLIPConfig()'s geometry)")
parser.add_argument("--batch", type=int, default=64, help="images a call (the pair's embedding chunk)")
parser.add_argument("--threads", type=int, default=1, help="torch threads (the pair's threads a worker)")
parser.add_argument("--repeats", type=int, default=3)
args = parser.parse_args()
if args.batch < 1 or args.threads < 1 or args.repeats < 1:
    parser.error("--batch, --threads and --repeats must be at least 1")
os.environ["OMP_NUM_THREADS"] = str(args.threads)

import torch  # noqa: E402 (after OMP_NUM_THREADS)
from transformers import CLIPConfig, CLIPModel  # noqa: E402

torch.set_num_threads(args.threads)
torch.manual_seed(0)
if args.model_dir:
    if not os.path.isfile(os.path.join(args.model_dir, "config.json")):
        parser.error("%s has no config.json: pass a transformers CLIP directory" % args.model_dir)
    model = CLIPModel.from_pretrained(args.model_dir)
else:
    model = CLIPModel(CLIPConfig())
model.eval()
vision = model.config.vision_config
images = torch.randn(args.batch, 3, vision.image_size, vision.image_size)
times = []
with torch.inference_mode():
    model.get_image_features(pixel_values=images[: min(8, args.batch)])
    for _ in range(args.repeats):
        start = time.perf_counter()
        model.get_image_features(pixel_values=images)
        times.append(time.perf_counter() - start)
print(json.dumps({
    "torch": torch.__version__,
    "geometry": {"image": vision.image_size, "patch": vision.patch_size, "hidden": vision.hidden_size,
                 "layers": vision.num_hidden_layers},
    "batch": args.batch, "threads": args.threads,
    "ms_per_image": round(1000 * statistics.median(times) / args.batch, 1),
    "ms_per_image_each": [round(1000 * t / args.batch, 1) for t in times],
}))
