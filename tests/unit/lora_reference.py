# SPDX-License-Identifier: Apache-2.0
"""The PEFT side of dtrain's LoRA tests (tests/unit/lora_test.cpp), run with the environment of
scripts/python-env (torch, transformers, peft). No downloads: the bases are decoder_reference.py's
seeded models.

    lora_reference.py make DIR
        makes decoder_reference.py's `llama` and `gpt2` in DIR, then for each a PEFT LoRA adapter
        with seeded random A and B (init_lora_weights=False, so that B is not zero), saved by
        save_pretrained as DIR/NAME_peft, and DIR/NAME_peft.safetensors: input_ids, attention_mask
        and the PeftModel's logits in fp32 eval mode.
          llama: r 4, lora_alpha 8, use_rslora, PEFT's own Llama targets q_proj and v_proj plus
                 o_proj, gate_proj, up_proj and down_proj
          gpt2:  r 4, lora_alpha 16, c_attn and c_fc (Conv1D: fan_in_fan_out)
    lora_reference.py check BASE_DIR ADAPTER_DIR FILE
        loads BASE_DIR with AutoModelForCausalLM and ADAPTER_DIR with PeftModel.from_pretrained,
        compares its logits on FILE's input_ids and attention_mask with FILE's "logits", then the
        logits of merge_and_unload() with the same.

Each command prints every check with its largest absolute difference, then "N checks, M failed", and
exits 1 when M > 0 or N == 0.
"""

import sys
import warnings

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

import decoder_reference as ref

warnings.filterwarnings("ignore")

ADAPTERS = {
    "llama": dict(r=4, lora_alpha=8, use_rslora=True,
                  target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "gpt2": dict(r=4, lora_alpha=16, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True),
}


def make(root):
    ref.make(root, list(ADAPTERS))
    input_ids, mask, *_ = ref.inputs()
    for name, options in ADAPTERS.items():
        base = AutoModelForCausalLM.from_pretrained(f"{root}/{name}", dtype=torch.float32)
        torch.manual_seed(5)
        model = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", init_lora_weights=False, **options)).eval()
        with torch.no_grad():
            logits = model(input_ids=input_ids, attention_mask=mask).logits
        model.save_pretrained(f"{root}/{name}_peft")
        save_file({"input_ids": input_ids, "attention_mask": mask, "logits": logits.contiguous()},
                  f"{root}/{name}_peft.safetensors")
        print(f"made {root}/{name}_peft: {sum(p.numel() for n, p in model.named_parameters() if 'lora_' in n)} adapter values")


def check(base_dir, adapter_dir, file):
    checks = ref.Checks()
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    with safe_open(file, "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    with torch.no_grad():
        logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"]).logits
        checks.close(f"PeftModel({adapter_dir}) logits", logits, t["logits"])
        merged = model.merge_and_unload()
        logits = merged(input_ids=t["input_ids"], attention_mask=t["attention_mask"]).logits
        checks.close("merge_and_unload() logits", logits, t["logits"])
    checks.finish()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(__doc__)
