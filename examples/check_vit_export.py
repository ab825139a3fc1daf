# SPDX-License-Identifier: Apache-2.0
"""Loads examples/finetune_vit's --export directory with transformers, as a Python user would, and
checks it against the run that wrote it.

    tests/tools/venv-python examples/check_vit_export.py EXPORT_DIR RUN_OUTPUT TRAIN_FOLDER

EXPORT_DIR: the Hugging Face directory; RUN_OUTPUT: the example's stdout (its JSON line, last of the
lines that start with "{"); TRAIN_FOLDER: the image folder's train/ (its class directories, sorted,
are the labels). Checks: ViTForImageClassification.from_pretrained loads it with no missing,
unexpected or mismatched key; id2label is the folder's classes; the export's ViTImageProcessor (PIL
backend) and the model, in eval mode, give for the run's probe_files (opened with PIL,
convert("RGB")) the logits dtrain printed (probe_logits), within TOLERANCE, and the same classes.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch
from PIL import Image
from transformers import ViTForImageClassification

try:
    from transformers import ViTImageProcessorPil as Processor
except ImportError:
    from transformers import ViTImageProcessor as Processor

TOLERANCE = 1e-4

export_dir, run_output, train_folder = sys.argv[1:4]
with open(run_output) as f:
    line = json.loads([l for l in f.read().splitlines() if l.startswith("{")][-1])
classes = sorted(d for d in os.listdir(train_folder) if os.path.isdir(os.path.join(train_folder, d)))

model, info = ViTForImageClassification.from_pretrained(export_dir, output_loading_info=True)
missing, unexpected, mismatched = info["missing_keys"], info["unexpected_keys"], info.get("mismatched_keys", [])
labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
if labels != classes:
    sys.exit("id2label %s is not the folder's classes %s" % (labels, classes))
if missing or unexpected or mismatched:
    sys.exit("missing %s, unexpected %s, mismatched %s" % (missing, unexpected, mismatched))

processor = Processor.from_pretrained(export_dir)
images = []
for path in line["probe_files"]:
    with Image.open(path) as im:
        images.append(im.convert("RGB"))
model.eval()
with torch.no_grad():
    theirs = model(processor(images, return_tensors="pt")["pixel_values"]).logits.double()
ours = torch.tensor(line["probe_logits"], dtype=torch.float64)
if ours.shape != theirs.shape:
    sys.exit("logits of shape %s from dtrain, %s from transformers" % (list(ours.shape), list(theirs.shape)))
gaps = (ours - theirs).abs().amax(1)
within = int((gaps <= TOLERANCE).sum())
same_class = ours.argmax(1).tolist() == theirs.argmax(1).tolist()
print("transformers classes %s, dtrain %s; largest logit difference per image %s"
      % (theirs.argmax(1).tolist(), ours.argmax(1).tolist(), ["%.3g" % g for g in gaps.tolist()]))
ok = within == len(ours) and same_class
print("export %s: %d labels, %d missing, %d unexpected, %d mismatched, %d of %d logits within %g"
      % ("ok" if ok else "FAILED", len(labels), len(missing), len(unexpected), len(mismatched), within, len(ours),
         TOLERANCE))
sys.exit(0 if ok else 1)
