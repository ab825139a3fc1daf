#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A PEFT adapter continued by finetune_llm --adapter at a learning rate of 0 is the adapter that was
exported: the run's eval loss equals the best eval loss of the run that exported it, and the best
checkpoint, served through nn::from_lora_checkpoint (which needs the base the adapter was recorded
on), generates what that run generated.

    check_peft_continue.py EXPORTING_RUN_OUTPUT -- finetune_llm ... --adapter DIR --lr 0 ...
"""
import json
import subprocess
import sys


def last_json_line(text, what):
    lines = [line for line in text.strip().splitlines() if line.startswith("{")]
    if not lines:
        sys.exit("FAIL %s printed no JSON line" % what)
    return json.loads(lines[-1])


split = sys.argv.index("--")
reference_file, command = sys.argv[1], sys.argv[split + 1:]
with open(reference_file, encoding="utf-8") as f:
    reference = last_json_line(f.read(), reference_file)
proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
sys.stderr.write(proc.stderr)
print(proc.stdout, end="")
if proc.returncode != 0:
    sys.exit("FAIL the continued run exited with status %d" % proc.returncode)
run = last_json_line(proc.stdout, "the continued run")
gap = abs(run["eval_loss"] - reference["best_eval_loss"])
if gap > 1e-5:
    sys.exit("FAIL eval_loss %r is not the exported adapter's %r" % (run["eval_loss"], reference["best_eval_loss"]))
if run["prompts"] != reference["prompts"] or not run["generations"]:
    sys.exit("FAIL give the continued run the exporting run's --generate prompts")
equal = sum(a == b for a, b in zip(run["generations"], reference["generations"]))
if equal != len(reference["generations"]):
    sys.exit("FAIL generations differ: %r against %r" % (run["generations"], reference["generations"]))
print("peft continue ok: eval_loss within %.1g of the adapter's, %d of %d generations equal" %
      (gap, equal, len(reference["generations"])))
