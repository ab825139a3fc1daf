#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""dtrain's BpeTokenizer against Hugging Face tokenizers (Rust) on the same texts (issue 51).

    tests/tools/venv-python benchmarks/bpe.py [--bench build/benchmarks/bpe_bench]
        [--corpus build/tests/data/text_corpus] [--vocab-size 32000] [--repeats 5]
        [--tokenizer TOKENIZER_JSON ...]

Run it with the Python of scripts/python-env (tokenizers 0.23.3). No pretrained byte-level
tokenizer can be downloaded here, so by default two are trained with tokenizers' BpeTrainer on the
corpus, `--vocab-size` tokens each (the trainer stops earlier when the corpus has no more pairs):
  gpt2    ByteLevel pre-tokenizer (GPT-2's pattern), ByteLevel decoder, <|endoftext|>;
  llama3  Split(Llama 3's pattern) + ByteLevel(use_regex=False), ignore_merges, Llama 3's special
          tokens, "<|begin_of_text|> $A";
or give tokenizer.json files with --tokenizer. Texts: every row of the corpus
(scripts/make-text-corpus: dataset.csv and holdout.csv), title + " " + description. Both sides
encode all of them as one batch (ids and attention mask):
  single  one thread: dtrain's encode_batch(texts, 1); tokenizers' encode_batch with
          TOKENIZERS_PARALLELISM=false (its Rust loop, no Python call per text);
  batch   every core: encode_batch(texts) on both sides (tokenizers: rayon's pool).
Each side runs in its own process, one warm-up and then `repeats` timed runs (tokenizers' word
cache and dtrain's are warm after the warm-up); the medians give texts/s, tokens/s and the ratio
dtrain / tokenizers. The ids of the two batches must be equal (exit 1 if not). Load is measured
around every run (benchmarks/idle.py): loaded figures are refused unless --allow-load.
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
               default=os.path.join(here, "..", "build", "benchmarks", "bpe_bench"))
p.add_argument("--corpus", default=os.path.join(here, "..", "build", "tests", "data", "text_corpus"))
p.add_argument("--tokenizer", action="append", help="a tokenizer.json to measure (default: train gpt2 and llama3)")
p.add_argument("--vocab-size", type=int, default=32000)
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--hf-child", choices=["single", "batch"], help=argparse.SUPPRESS)
p.add_argument("--texts", help=argparse.SUPPRESS)
p.add_argument("--ids", help=argparse.SUPPRESS)
idle.add_argument(p)
args = p.parse_args()

try:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
except ImportError:
    sys.exit("bpe.py: no tokenizers here; run it with tests/tools/venv-python (scripts/python-env makes it)")

if args.hf_child:  # tokenizers' side, in a process of its own (TOKENIZERS_PARALLELISM is read from its env)
    texts = [json.loads(line) for line in open(args.texts, encoding="utf-8")]
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(args.tokenizer[0])
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
                f.write(json.dumps({"input_ids": e.ids, "attention_mask": e.attention_mask}) + "\n")
    print(json.dumps({"load_s": load_s, "s": times}))
    sys.exit(0)

if not os.path.exists(args.bench):
    sys.exit("bpe.py: %s does not exist; build it (cmake --build build --target bpe_bench)" % args.bench)
if args.repeats < 1:
    sys.exit("bpe.py: --repeats must be at least 1")
rows = []
for name in ("dataset.csv", "holdout.csv"):
    path = os.path.join(args.corpus, name)
    if not os.path.exists(path):
        sys.exit("bpe.py: no %s; make the corpus with scripts/make-text-corpus %s" % (path, args.corpus))
    with open(path, newline="", encoding="utf-8") as f:
        rows += list(csv.DictReader(f))
texts = [r["title"] + " " + r["description"] for r in rows]
work = tempfile.mkdtemp(prefix="dtrain_bpe_bench_")
texts_path = os.path.join(work, "texts.jsonl")
with open(texts_path, "w", encoding="utf-8") as f:
    for t in texts:
        f.write(json.dumps(t) + "\n")

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")


def train(flavour):
    """A tokenizer.json of `flavour` (gpt2 or llama3) trained on the corpus."""
    tok = Tokenizer(models.BPE())
    if flavour == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        specials = ["<|endoftext|>"]
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        specials = []
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=args.vocab_size, special_tokens=specials,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    if flavour == "llama3":
        tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"] +
                               ["<|reserved_special_token_%d|>" % i for i in range(250)] + ["<|eot_id|>"])
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    j = json.loads(tok.to_str())
    if flavour == "llama3":
        j["model"]["ignore_merges"] = True
    path = os.path.join(work, flavour + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    return path


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        sys.exit("bpe.py: %s failed (exit %d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return json.loads(r.stdout.strip().splitlines()[-1])


tokenizers_ = [(os.path.basename(t), t) for t in args.tokenizer] if args.tokenizer else \
    [(flavour, train(flavour)) for flavour in ("gpt2", "llama3")]
records, results, failed = [], {}, False
idle.wait(args.allow_load)
for name, path in tokenizers_:
    ours_ids, theirs_ids = os.path.join(work, name + ".dtrain.jsonl"), os.path.join(work, name + ".tokenizers.jsonl")
    with idle.Run() as load:
        ours = run([args.bench, path, texts_path, str(args.repeats), ours_ids])
    records.append(load.record)
    theirs = {}
    for mode in ("single", "batch"):
        env = dict(os.environ)
        env.pop("TOKENIZERS_PARALLELISM", None)
        env.pop("RAYON_NUM_THREADS", None)
        if mode == "single":
            env["TOKENIZERS_PARALLELISM"] = "false"
        child = [sys.executable, os.path.abspath(__file__), "--hf-child", mode, "--texts", texts_path, "--tokenizer",
                 path, "--repeats", str(args.repeats)] + (["--ids", theirs_ids] if mode == "batch" else [])
        with idle.Run() as load:
            theirs[mode] = run(child, env)
        records.append(load.record)
    with open(ours_ids) as a, open(theirs_ids) as b:
        lines = list(zip(a, b))
    differing = [i for i, (x, y) in enumerate(lines) if json.loads(x) != json.loads(y)]
    equal = not differing and len(lines) == len(texts)
    vocab = len(json.load(open(path, encoding="utf-8"))["model"]["vocab"])
    n, tokens = len(texts), ours["tokens"]
    result = {"vocab": vocab, "texts": n, "tokens": tokens, "ids_equal": equal, "rows_compared": len(lines),
              "load_s": {"dtrain": ours["load_s"], "tokenizers": theirs["batch"]["load_s"]}}
    print("%s: %d texts, %d tokens (%.0f a text), vocabulary %d, median of %d runs on %d cores"
          % (name, n, tokens, tokens / n, vocab, args.repeats, os.cpu_count()))
    for mode, key in (("single", "single_s"), ("batch", "batch_s")):
        d, t = statistics.median(ours[key]), statistics.median(theirs[mode]["s"])
        result[mode] = {"dtrain_texts_per_s": n / d, "tokenizers_texts_per_s": n / t, "dtrain_tokens_per_s": tokens / d,
                        "tokenizers_tokens_per_s": tokens / t, "ratio": t / d}
        print("  %-6s dtrain %8.0f texts/s %10.0f tokens/s   tokenizers %8.0f texts/s %10.0f tokens/s   "
              "dtrain / tokenizers x%.2f" % (mode, n / d, tokens / d, n / t, tokens / t, t / d))
    print("  tokenizer read: dtrain %.3f s, tokenizers %.3f s" % (ours["load_s"], theirs["batch"]["load_s"]))
    if equal:
        print("  ids: equal on all %d rows (input_ids, attention_mask)" % len(lines))
    else:
        failed = True
        print("  FAIL ids differ on %d of %d rows (first: row %s)" % (len(differing), len(lines),
                                                                     differing[0] if differing else "-"))
    results[name] = result
results["load"] = idle.verdict(records)
results["cores"] = os.cpu_count()
results["repeats"] = args.repeats
print(json.dumps(results))
if failed:
    sys.exit(1)
idle.refuse(results["load"], args.allow_load)
