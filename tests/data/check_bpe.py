#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""dtrain's BpeTokenizer against Hugging Face tokenizers, row by row.

    check_bpe.py BPE_IDS CORPUS_DIR WORK_DIR

Run with the Python of scripts/python-env (tests/tools/venv-python): tokenizers comes from there.
No pretrained tokenizer can be downloaded, so the tokenizers are trained here with tokenizers'
own BpeTrainer on the corpus, in the flavours of the real ones:
  gpt2     ByteLevel pre-tokenizer (GPT-2's pattern), ByteLevel decoder and post-processor,
           <|endoftext|> (normalized, as GPT-2's file has it); and a variant with
           add_prefix_space, added tokens with lstrip / rstrip / single_word, truncation at 64
           and right padding to a multiple of 8; and one trained with continuing_subword_prefix
           "##" and end_of_word_suffix "</w>";
  llama3   Split(Llama 3's pattern, Isolated) then ByteLevel(use_regex=False), ignore_merges,
           (and the same with patterns BpeTokenizer runs through PCRE2: tiktoken's o200k, DeepSeek
           V3's three Splits);
           Llama 3's special tokens added after the vocabulary, TemplateProcessing
           "<|begin_of_text|> $A"; a variant truncated on the left at 48 and padded on the left;
           and Qwen2's: the NFC normalizer, and its pattern (one digit a piece);
  llama2   byte fallback (<0x00>..<0xFF> in the vocabulary, a small alphabet so that rare
           characters fall back to bytes), unk <unk> fused, Prepend + Replace normalizer, no
           pre-tokenizer (a text is one word: long words), "<s> $A", decoder Replace / ByteFallback
           / Fuse / Strip; a Mistral-like variant with a Metaspace pre-tokenizer and decoder; and
           one without <0xF0> and <0xE4>, whose emoji and CJK become one <unk> (fuse_unk).
  clip     transformers' CLIPTokenizer built from a vocabulary and merges trained with CLIP's
           stages (NFC, Replace of \s+, Lowercase; CLIP's Split, Removed and inverted, then
           ByteLevel; </w> suffixes; RobertaProcessing), saved by save_pretrained; its ids must
           equal tokenizers' of the same file, and so dtrain's.
Texts: every row of CORPUS_DIR's dataset.csv and holdout.csv (title + " " + description), a list of
hard cases and seeded random strings over Unicode. For each tokenizer and text: encode(text).ids,
encode(text, add_special_tokens=False).ids, the padded encoding, encode_batch's row, decode(ids)
and decode(ids, skip_special_tokens=False) must equal dtrain's, as must BOS/EOS where the file
names them. Prints counts; exit 1 on any difference (the first is printed with both sides).
"""
import csv
import json
import random
import subprocess
import sys
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

tool, corpus, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
work.mkdir(parents=True, exist_ok=True)
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

SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<s>", "</s>"]
hard = [
    "", " ", "  ", "a", "'", "''s", "\t\n\r ", "\r\n", "\n\n\n", "a\r\n\r\nb", "trailing spaces   ", "   leading",
    "tabs\t\tand\t spaces \t", "mixed \u3000ideographic\u00a0nbsp\u2028line\u2029para\u0085nel\x0bvt\x0cff",
    "Café résumé naïve façade jalapeño", "e\u0301 a\u0301\u0316 o\u0316\u0301 combining marks",
    "İstanbul ıi ß ẞ ﬁ ﬂ Ǆ ǅ", "Ω ω ΣΑΣ ς Ὀδυσσεύς", "Ｆｕｌｌｗｉｄｔｈ　ｆｏｒｍｓ１２３！？",
    "中文字符测试，标点。", "日本語のテキスト、カタカナ", "한국어 텍스트 각", "Привет мир", "مرحبا بالعالم", "שָׁלוֹם",
    "हिन्दी भाषा", "ไทย ภาษา", "emoji 😀👍🏽👨‍👩‍👧 🥰 🏳️‍🌈 🇩🇪", "zero\u200bwidth\u200cnon\u200djoiner\u2060word",
    "ctrl\x00\x01\x07\x1b\x7f chars", "\ufffd replacement \ufeffbom", "\U0001d400\U0001d401 math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "Ⅻ roman ①②③ ½ ¾ ²³ ٠١٢٣ ௰", "1234567890123456789012345678901234567890", "3.14159 1,000,000 1e-5 0x1F 007",
    "I'm you're they've she'll he'd it's we'RE THEY'VE I'M SHE'LL HE'D IT'S 'S 'LL 'D 'T 'M ſ 'ſ",
    "don't stop-believing!!! ... $100 #hash @user <html> `tick` ~tilde ^caret |pipe| {brace} \\back",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] * 2; }  // loop\r\n",
    "<|endoftext|>", "a<|endoftext|>b", " <|endoftext|> ", "<|begin_of_text|>Hello<|eot_id|>",
    "<|end_of_text|><|end_of_text|>", "<s>[INST] hi [/INST]</s>", "<|endoftext", "|endoftext|>",
    "<mask> lstrip   <mask>x", "hello world in a single word, hello worlds, xhello world", "foo rstrip_me   bar",
    "x" * 300, "ab" * 150, "😀" * 40, " " * 50 + "x", "\n" * 20 + "y",
    "\u2019quotes\u201d «guillemets» ‹› –—― dashes …", "¡¿ inverted ¿?", "§¶†‡•",
    "\U000e0001 tag \U0010ffff \ue000 private use", "\u0600\u0601 arabic number sign", "\U00020000\U0002a700 cjk ext",
    "Hello世界мир🙂!", "a\u0300\u0301\u0302\u0303\u0304\u0305\u0306\u0307\u0308 stacked", "ǰ̣ ḝ",
]
rng = random.Random(51)
blocks = [(0x20, 0x7E), (0x20, 0x24F), (0x300, 0x36F), (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0xDFF),
          (0x1100, 0x11FF), (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x3000, 0x30FF), (0x4E00, 0x4E80), (0xAC00, 0xAD00),
          (0xF900, 0xFFFF), (0x1D100, 0x1D7FF), (0x1F300, 0x1FAFF), (0x0, 0x10FFFF)]
randoms = []
for _ in range(2000):
    s = []
    for _ in range(rng.randint(1, 40)):
        lo, hi = rng.choice(blocks)
        c = rng.randint(lo, hi)
        if 0xD800 <= c <= 0xDFFF:
            c = 0x20
        s.append(chr(c))
        r = rng.random()
        if r < 0.15:
            s.append(" ")
        elif r < 0.2:
            s.append(rng.choice(["'s", "'LL", "\r\n", "\n", "\t", "  ", "123", rng.choice(SPECIALS)]))
    randoms.append("".join(s))
texts = corpus_texts + hard + randoms
train_texts = corpus_texts + hard

# --- tokenizers, trained here --------------------------------------------------------------------
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
# Patterns BpeTokenizer has no scanner for, run by PCRE2: tiktoken's o200k (GPT-4o), DeepSeek V3's
# three splits, and CLIP's (the matches kept, the rest removed).
O200K = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])
DEEPSEEK3 = [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
             r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+"]
CLIP = r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"


def save(name, tok_or_json):
    path = work / (name + ".json")
    text = tok_or_json.to_str() if isinstance(tok_or_json, Tokenizer) else json.dumps(tok_or_json, ensure_ascii=False)
    path.write_text(text, encoding="utf-8")
    return path


def edit(path, name, change):
    j = json.loads(path.read_text(encoding="utf-8"))
    change(j)
    return save(name, j)


def train_gpt2():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.train_from_iterator(train_texts, trainers.BpeTrainer(
        vocab_size=6000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    path = save("gpt2", tok)

    def normalized_eot(j):  # GPT-2's file: <|endoftext|> is special and normalized
        for t in j["added_tokens"]:
            t["normalized"] = True
    return edit(path, "gpt2", normalized_eot)


def gpt2_variant(path):
    tok = Tokenizer.from_file(str(path))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tok.add_tokens([AddedToken("hello world", single_word=True), AddedToken(" rstrip_me", rstrip=True, normalized=False)])
    tok.enable_truncation(64)
    tok.enable_padding(pad_id=0, pad_token="<|endoftext|>", pad_to_multiple_of=8)
    return save("gpt2_prefix_added", tok)


def train_affixes():
    """GPT-2's flavour with continuing_subword_prefix "##" and end_of_word_suffix "</w>" (CLIP's
    suffix): a word's units are c, ##c, ##c</w> (c</w> alone), and merges keep them."""
    tok = Tokenizer(models.BPE(continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(train_texts, trainers.BpeTrainer(
        vocab_size=4000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        continuing_subword_prefix="##", end_of_word_suffix="</w>", show_progress=False))
    return save("gpt2_affixes", tok)


def train_llama3(pattern, name):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    patterns = pattern if isinstance(pattern, list) else [pattern]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in patterns] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(train_texts, trainers.BpeTrainer(
        vocab_size=7000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                "<|finetune_right_pad_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    specials += ["<|reserved_special_token_%d|>" % i for i in range(2, 40)]
    tok.add_special_tokens(specials)
    bot = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bot)])])
    path = save(name, tok)

    def ignore_merges(j):  # the trainer builds a new model: Llama 3's file sets ignore_merges
        j["model"]["ignore_merges"] = True
    return edit(path, name, ignore_merges)


def llama3_variant(path):
    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(48, direction="left")
    tok.enable_padding(direction="left", pad_id=tok.token_to_id("<|finetune_right_pad_id|>"),
                       pad_token="<|finetune_right_pad_id|>")
    return save("llama3_left", tok)


def train_llama2():
    # Trained on Metaspace words (fast); the file then reads as Llama 2's: Prepend + Replace
    # normalizer, no pre-tokenizer (each text between added tokens is one word), byte fallback.
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    fallback = ["<0x%02X>" % b for b in range(256)]
    tok.train_from_iterator(train_texts, trainers.BpeTrainer(
        vocab_size=4000, special_tokens=["<unk>", "<s>", "</s>"] + fallback, limit_alphabet=150, show_progress=False))
    path = save("llama2_trained", tok)

    def llama2(j):
        j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] in ("<unk>", "<s>", "</s>")]
        j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                               {"type": "Replace", "pattern": {"String": " "},
                                                                "content": "▁"}]}
        j["pre_tokenizer"] = None
        j["post_processor"] = {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}},
                                        {"SpecialToken": {"id": "<s>", "type_id": 1}},
                                        {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    llama2_path = edit(path, "llama2", llama2)

    def mistral(j):
        llama2(j)
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                                       "split": False}, {"type": "Fuse"}]}
    def unknown(j):  # no fallback for 4-byte characters (emoji) nor E4 (CJK): those are <unk>, fused
        llama2(j)
        for t in ("<0xF0>", "<0xE4>"):
            del j["model"]["vocab"][t]
    return llama2_path, edit(path, "mistral_metaspace", mistral), edit(path, "llama2_unk", unknown)


def train_clip():
    """CLIP's tokenizer as transformers' CLIPTokenizer (the fast one) builds it from a vocabulary
    and merges, trained here with CLIP's stages; saved by transformers' save_pretrained."""
    from transformers import CLIPTokenizer
    tok = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                           normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(CLIP), behavior="removed", invert=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.train_from_iterator(train_texts, trainers.BpeTrainer(
        vocab_size=5000, special_tokens=["<|startoftext|>", "<|endoftext|>"], end_of_word_suffix="</w>",
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(tok.to_str())["model"]
    clip = CLIPTokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]])
    directory = work / "clip"
    clip.save_pretrained(str(directory))
    return directory / "tokenizer.json", clip


# --- comparison ----------------------------------------------------------------------------------
compared = 0


def check(name, path, texts, expect_bos=None, expect_eos=None, must_see=None):
    """Compares dtrain's rows with tokenizers'; must_see: {what: token names}, each of which some
    row's ids must hold (so that the feature is exercised, not merely allowed)."""
    global compared
    tok = Tokenizer.from_file(str(path))
    inp, out = work / (name + ".in.jsonl"), work / (name + ".out.jsonl")
    with open(inp, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
    r = subprocess.run([tool, str(path), str(inp), str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        return fail("%s: bpe_ids exits %d: %s" % (name, r.returncode, r.stdout.strip()))
    lines = open(out, encoding="utf-8").read().rstrip("\n").split("\n")
    ours, info = [json.loads(line) for line in lines[:-1]], json.loads(lines[-1])
    if len(ours) != len(texts):
        return fail("%s: %d rows out for %d in" % (name, len(ours), len(texts)))
    bare = Tokenizer.from_file(str(path))
    bare.no_padding()
    unpadded = bare.encode_batch(texts)
    plain = bare.encode_batch(texts, add_special_tokens=False)
    if tok.padding:  # encode pads one text (Fixed, or BatchLongest to itself), encode_batch all of them
        single = [tok.encode(t) for t in texts]
        batch = tok.encode_batch(texts)
    else:
        single = batch = unpadded
    ids = [e.ids for e in single]
    decoded = tok.decode_batch(ids)
    raw = tok.decode_batch(ids, skip_special_tokens=False)
    differing, first = 0, None
    for i, o in enumerate(ours):
        want = {"ids": unpadded[i].ids, "plain": plain[i].ids,
                "single": {"input_ids": single[i].ids, "attention_mask": single[i].attention_mask},
                "batch": {"input_ids": batch[i].ids, "attention_mask": batch[i].attention_mask},
                "decoded": decoded[i], "raw": raw[i]}
        for key, value in want.items():
            if o[key] != value:
                differing += 1
                if first is None:
                    first = (key, texts[i], o[key], value)
                break
        compared += 1
    if expect_bos is not None and info["bos"] != tok.token_to_id(expect_bos):
        fail("%s: bos %r, tokenizers' %s is %r" % (name, info["bos"], expect_bos, tok.token_to_id(expect_bos)))
    if expect_eos is not None and info["eos"] != tok.token_to_id(expect_eos):
        fail("%s: eos %r, tokenizers' %s is %r" % (name, info["eos"], expect_eos, tok.token_to_id(expect_eos)))
    seen = []
    for what, names in (must_see or {}).items():
        wanted = {tok.token_to_id(t) for t in names} - {None}
        rows_with = sum(1 for e in plain if wanted & set(e.ids))  # typed or made, not the template's
        seen.append("%s in %d rows" % (what, rows_with))
        if rows_with == 0:
            fail("%s: no text exercises %s" % (name, what))
    if first:
        key, row, got, exp = first
        fail("%s: %d of %d rows differ; the first, row %r, in %s:\n  dtrain:     %s\n  tokenizers: %s" %
             (name, differing, len(ours), row[:300], key, json.dumps(got)[:1500], json.dumps(exp)[:1500]))
    else:
        print("ok %s: %d rows equal (ids, without special tokens, padded, batch, decoded twice)%s"
              % (name, len(ours), "; " + ", ".join(seen) if seen else ""))
    return differing


FALLBACK = ["<0x%02X>" % b for b in range(256)]
gpt2 = train_gpt2()
check("gpt2", gpt2, texts, expect_eos="<|endoftext|>", must_see={"<|endoftext|>": ["<|endoftext|>"]})
check("gpt2_prefix_added", gpt2_variant(gpt2), texts, expect_eos="<|endoftext|>",
      must_see={"<mask>": ["<mask>"], "hello world": ["hello world"], "rstrip_me": [" rstrip_me"]})
check("gpt2_affixes", train_affixes(), texts)
llama3 = train_llama3(LLAMA3, "llama3")
check("llama3", llama3, texts, expect_bos="<|begin_of_text|>", expect_eos="<|end_of_text|>",
      must_see={"special tokens typed": ["<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>"]})
check("llama3_left", llama3_variant(llama3), texts, expect_bos="<|begin_of_text|>")


def qwen2(j):  # Qwen2's file: NFC, then Llama 3's pattern with one digit a piece
    j["normalizer"] = {"type": "NFC"}
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2


check("qwen2_nfc", edit(llama3, "qwen2_nfc", qwen2), texts)
nfc_changes = sum(1 for t in texts if normalizers.NFC().normalize_str(t) != t)
print("qwen2_nfc: NFC changes %d of the texts" % nfc_changes)
if nfc_changes == 0:
    fail("qwen2_nfc: no text exercises NFC")
o200k = train_llama3(O200K, "o200k")
check("o200k", o200k, texts, expect_bos="<|begin_of_text|>")
check("deepseek3", train_llama3(DEEPSEEK3, "deepseek3"), texts, expect_bos="<|begin_of_text|>")
clip_path, clip = train_clip()
check("clip", clip_path, texts, expect_bos="<|startoftext|>", expect_eos="<|endoftext|>")
# What the text tower gets from transformers' CLIPTokenizer is what tokenizers gives for the file
# check() compared dtrain with: CLIPTokenizer adds nothing to the ids.
clip_ids = clip(texts)["input_ids"]
clip_file = Tokenizer.from_file(str(clip_path)).encode_batch(texts)
differ = sum(1 for a, b in zip(clip_ids, clip_file) if a != b.ids)
if differ:
    fail("clip: transformers' CLIPTokenizer and tokenizers differ on %d rows of the saved tokenizer.json" % differ)
else:
    print("ok clip: transformers' CLIPTokenizer gives the same ids as its tokenizer.json on %d rows" % len(texts))
llama2, mistral, llama2_unk = train_llama2()
check("llama2_byte_fallback", llama2, texts, expect_bos="<s>", expect_eos="</s>", must_see={"byte fallback": FALLBACK})
check("mistral_metaspace", mistral, texts, expect_bos="<s>", expect_eos="</s>", must_see={"byte fallback": FALLBACK})
check("llama2_unk", llama2_unk, texts, must_see={"<unk>": ["<unk>"], "byte fallback": FALLBACK})
print("rows compared: %d (%d texts: %d corpus rows, %d hard cases, %d random strings)"
      % (compared, len(texts), len(corpus_texts), len(hard), len(randoms)))
if compared == 0:
    fail("no rows compared")
sys.exit(1 if failures else 0)
