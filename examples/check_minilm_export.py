# SPDX-License-Identifier: Apache-2.0
"""Loads examples/finetune_text_classifier's --export directory with transformers, as a Python user
would, and checks it against the run that wrote it.

    tests/tools/venv-python examples/check_minilm_export.py EXPORT_DIR RUN_OUTPUT DATASET_CSV

EXPORT_DIR: the Hugging Face directory; RUN_OUTPUT: the example's stdout (its JSON line, last of
the lines that start with "{"); DATASET_CSV: the corpus's dataset.csv (its tags, sorted, are the
labels). Checks: AutoModelForSequenceClassification loads it with no missing or unexpected key;
id2label is the sorted tags; AutoTokenizer loads the tokenizer files; the model, in eval mode,
predicts for the run's raw strings the labels dtrain's Predictor printed (raw_predictions).
"""
import csv
import json
import os
import sys

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

export_dir, run_output, dataset = sys.argv[1:4]
with open(run_output) as f:
    line = json.loads([l for l in f.read().splitlines() if l.startswith("{")][-1])
csv.field_size_limit(sys.maxsize)
with open(dataset, newline="", encoding="utf-8") as f:
    tags = sorted({r["tag"] for r in csv.DictReader(f)})

model, info = AutoModelForSequenceClassification.from_pretrained(export_dir, output_loading_info=True)
missing, unexpected = info["missing_keys"], info["unexpected_keys"]
labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
if labels != tags:
    sys.exit("id2label %s is not the corpus's tags %s" % (labels, tags))
if missing or unexpected or info.get("mismatched_keys"):
    sys.exit("missing %s, unexpected %s, mismatched %s" % (missing, unexpected, info.get("mismatched_keys")))

tokenizer = AutoTokenizer.from_pretrained(export_dir)
texts = ["command-line tool to manage disk partitions", "HTTP proxy server daemon",
         "a chess engine with a graphical board", "library for numerical linear algebra"]
model.eval()
with torch.no_grad():
    batch = tokenizer(texts, truncation=True, max_length=line["max_len"], padding="longest", return_tensors="pt")
    predicted = [labels[i] for i in model(**batch).logits.argmax(1).tolist()]
theirs = line["raw_predictions"]
equal = sum(a == b for a, b in zip(predicted, theirs))
print("transformers: %s\ndtrain:       %s" % (predicted, theirs))
print("export ok: %d labels, %d missing, %d unexpected, %d of %d predictions equal"
      % (len(labels), len(missing), len(unexpected), equal, len(texts)))
sys.exit(0 if equal == len(texts) else 1)
