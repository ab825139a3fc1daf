# SPDX-License-Identifier: Apache-2.0
"""Loads examples/finetune_llm's exports as a Python user would, and checks them against the run.

    tests/tools/venv-python examples/check_llm_export.py BASE_DIR ADAPTER_DIR MERGED_DIR RUN_OUTPUT

BASE_DIR: the base model the run fine-tuned; ADAPTER_DIR: its --export-adapter (PEFT); MERGED_DIR:
its --export-merged (the adapters folded in); RUN_OUTPUT: the example's stdout (its JSON line: the
prompts and what the best checkpoint generated for each, greedy). Checks: PeftModel.from_pretrained
(base, adapter) and AutoModelForCausalLM.from_pretrained(merged) load with no missing or unexpected
key; their logits on each prompt agree within TOLERANCE; and greedy generation of each (as many new
tokens as the run asked) gives the run's text, for both.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch
from peft import PeftModel
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

TOLERANCE = 1e-4

base_dir, adapter_dir, merged_dir, run_output = sys.argv[1:5]
with open(run_output) as f:
    line = json.loads([l for l in f.read().splitlines() if l.startswith("{")][-1])
tok = Tokenizer.from_file(os.path.join(base_dir, "tokenizer.json"))

base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
peft = PeftModel.from_pretrained(base, adapter_dir).eval()
merged, info = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32, output_loading_info=True)
merged.eval()
if info["missing_keys"] or info["unexpected_keys"]:
    sys.exit("merged export: missing %s, unexpected %s" % (info["missing_keys"], info["unexpected_keys"]))

worst, same = 0.0, 0
for prompt, text in zip(line["prompts"], line["generations"]):
    ids = torch.tensor([tok.encode(prompt).ids])
    with torch.no_grad():
        worst = max(worst, (peft(input_ids=ids).logits - merged(input_ids=ids).logits).abs().max().item())
        outs = [m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=line["max_new_tokens"],
                           do_sample=False) for m in (peft, merged)]
    texts = [tok.decode(o[0, ids.shape[1]:].tolist(), skip_special_tokens=True) for o in outs]
    print("prompt %r: dtrain %r, PEFT %r, merged %r" % (prompt, text, texts[0], texts[1]))
    same += texts[0] == text and texts[1] == text
print("export ok: logits within %.3g, %d of %d generations equal" % (worst, same, len(line["prompts"])))
sys.exit(0 if worst <= TOLERANCE and same == len(line["prompts"]) else 1)
