# SPDX-License-Identifier: Apache-2.0
"""The Python side of dtrain's decoder tests (tests/unit/decoder_test.cpp), run with the environment
of scripts/python-env (torch, transformers, safetensors). No downloads: every model is made here
from a seeded config.

    decoder_reference.py make DIR [NAME...]
        saves small causal LMs with seeded random weights by save_pretrained, each as DIR/NAME:
          llama       LlamaForCausalLM, grouped-query attention (4 heads, 2 kv heads), llama3 rope
                      scaling, untied head, fp32, one file
          llama_tied  LlamaForCausalLM, default rope, tied head, q/k/v/o biases, bf16, sharded
          llama_bare  the bare LlamaModel of `llama` (keys without "model.")
          mistral     MistralForCausalLM with a sliding window of 4 tokens, fp16
          qwen2       Qwen2ForCausalLM (biases on q, k and v)
          gpt2        GPT2LMHeadModel (tied, Conv1D weights)
          gpt2_bare   the bare GPT2Model of `gpt2` (keys as the hub's gpt2: "h.0.attn.c_attn.weight")
        and DIR/NAME.safetensors: input_ids [3, 10], attention_mask (row 1 right-padded, row 2
        left-padded), labels (-100 on padding and on row 0's first 3 tokens), and in fp32 eval mode
        the logits, the labels= loss, and greedy generate(max_new_tokens=32) of left-padded prompts
        ("prompt_ids", "prompt_mask", "generated"), and the logits of packed rows ("packed_ids",
        "packed_positions": documents whose positions restart at 0, no attention_mask nor cache; "packed_logits"). A bf16 or fp16 file's references are computed
        from the rounded weights, in fp32. Default: every NAME but chat.
          chat        a LlamaForCausalLM whose vocabulary is a byte-level BPE tokenizer trained here by
                      tokenizers (DIR/chat/tokenizer.json, <|endoftext|> its EOS and pad), and
                      DIR/chat.json: prompts and the text transformers generates greedily after each
                      (left-padded, 12 new tokens, decoded with skip_special_tokens)
    decoder_reference.py check MODEL_DIR FILE [MODEL_DIR FILE ...]
        loads MODEL_DIR with AutoModelForCausalLM.from_pretrained (no missing or unexpected key
        allowed), runs it in fp32 eval mode on FILE's input_ids and attention_mask and compares the
        logits (every position, the padding's too) with FILE's "logits"; each pair in turn, in one
        process (transformers imports once).

Each command prints every check with its largest absolute difference, then "N checks, M failed", and
exits 1 when M > 0 or N == 0.
"""

import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file
import transformers
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

TOLERANCE = 1e-5
VOCAB = 96
transformers.logging.set_verbosity_error()


class Checks:
    def __init__(self):
        self.checks = self.failed = 0

    def result(self, name, ok, detail):
        self.checks += 1
        self.failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")

    def close(self, name, ours, theirs, mask=None):
        gap = (ours.double() - theirs.double()).abs()
        if mask is not None:
            gap = gap[mask.bool()]
        worst = gap.max().item() if gap.numel() else 0.0
        self.result(name, worst <= TOLERANCE, f"largest difference {worst:.3g}")

    def finish(self):
        print(f"{self.checks} checks, {self.failed} failed")
        sys.exit(1 if self.failed or not self.checks else 0)


def sizes(**extra):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                initializer_range=0.1)
    base.update(extra)
    return base


def make_model(name):
    torch.manual_seed(sum(map(ord, name)))
    if name in ("llama", "llama_bare"):
        return LlamaForCausalLM(LlamaConfig(**sizes(rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16}, rope_theta=10000.0))), torch.float32
    if name == "llama_tied":
        return LlamaForCausalLM(LlamaConfig(**sizes(num_key_value_heads=4, tie_word_embeddings=True,
                                                    attention_bias=True, rope_theta=500.0))), torch.bfloat16
    if name == "mistral":
        return MistralForCausalLM(MistralConfig(**sizes(sliding_window=4))), torch.float16
    if name == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**sizes(num_hidden_layers=3))), torch.float32
    if name in ("gpt2", "gpt2_bare"):
        return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                          bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.1)), torch.float32
    raise SystemExit(f"unknown model {name}")


def inputs():
    g = torch.Generator().manual_seed(7)
    input_ids = torch.randint(3, VOCAB, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 7:] = 0  # right padding
    mask[2, :4] = 0  # left padding
    input_ids[mask == 0] = 0
    labels = input_ids.clone()
    labels[mask == 0] = -100
    labels[0, :3] = -100
    prompt_ids = torch.randint(3, VOCAB, (2, 6), generator=g)
    prompt_mask = torch.ones(2, 6, dtype=torch.long)
    prompt_mask[1, :2] = 0
    prompt_ids[prompt_mask == 0] = 0
    return input_ids, mask, labels, prompt_ids, prompt_mask


def packed():
    """Two rows of 12 tokens: documents of 5 and 7 tokens, and of 3, 4 and 5."""
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(3, VOCAB, (2, 12), generator=g)
    positions = torch.tensor([list(range(5)) + list(range(7)), list(range(3)) + list(range(4)) + list(range(5))])
    return ids, positions


CORPUS = ["Hello world, hello there.", "The quick brown fox jumps over the lazy dog.", "A cat sat on the mat.",
          "Numbers like 12 and 345 appear too.", "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve r\u00e9sum\u00e9."] * 20


def make_chat(root):
    import json
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    eos = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(11)
    model = LlamaForCausalLM(LlamaConfig(**sizes(vocab_size=tok.get_vocab_size(), bos_token_id=None, eos_token_id=eos,
                                                 pad_token_id=eos))).eval()
    prompts = ["Hello world", "The quick brown fox", "Caf\u00e9"]
    rows = [tok.encode(p).ids for p in prompts]
    longest = max(map(len, rows))
    ids = torch.tensor([[eos] * (longest - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        generated = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    texts = [tok.decode(g[longest:].tolist(), skip_special_tokens=True) for g in generated]
    model.save_pretrained(f"{root}/chat")
    tok.save(f"{root}/chat/tokenizer.json")
    with open(f"{root}/chat.json", "w") as f:
        json.dump({"prompts": prompts, "texts": texts}, f)
    print(f"made {root}/chat: vocabulary {tok.get_vocab_size()}, texts {texts}")


def make(root, names):
    input_ids, mask, labels, prompt_ids, prompt_mask = inputs()
    for name in names:
        if name == "chat":
            make_chat(root)
            continue
        model, dtype = make_model(name)
        model.eval()
        if dtype != torch.float32:  # the file's rounding, in the fp32 model the references come from
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(dtype).to(torch.float32))
        packed_ids, packed_positions = packed()
        with torch.no_grad():
            out = model(input_ids=input_ids, attention_mask=mask, labels=labels)
            # use_cache=False: with a cache transformers does not look for packed documents.
            packed_logits = model(input_ids=packed_ids, position_ids=packed_positions, use_cache=False).logits
            generated = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, max_new_tokens=32,
                                       do_sample=False)
        target = f"{root}/{name}"
        if name == "llama_bare":
            model.model.save_pretrained(target)
        elif name == "gpt2_bare":
            model.transformer.save_pretrained(target)
        else:
            model.to(dtype).save_pretrained(target, max_shard_size="40KB" if name == "llama_tied" else "5GB")
        save_file({"input_ids": input_ids, "attention_mask": mask, "labels": labels, "logits": out.logits.contiguous(),
                   "loss": out.loss.reshape(1), "prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
                   "generated": generated.contiguous(), "packed_ids": packed_ids, "packed_positions": packed_positions,
                   "packed_logits": packed_logits.contiguous()}, f"{root}/{name}.safetensors")
        print(f"made {target}: {dtype}, generated {generated.shape[1] - prompt_ids.shape[1]} tokens")


def check(checks, model_dir, file):
    model, info = AutoModelForCausalLM.from_pretrained(model_dir, output_loading_info=True, dtype=torch.float32)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        checks.result(f"{model_dir}: {kind}", not info.get(kind), str(sorted(info.get(kind) or [])))
    model.eval()
    with safe_open(file, "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    with torch.no_grad():
        logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"]).logits
    checks.close(f"{model_dir}: {type(model).__name__} logits", logits, t["logits"])


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3:] or ["llama", "llama_tied", "llama_bare", "mistral", "qwen2", "gpt2", "gpt2_bare"])
    elif len(sys.argv) >= 4 and sys.argv[1] == "check" and len(sys.argv) % 2 == 0:
        checks = Checks()
        for i in range(2, len(sys.argv), 2):
            check(checks, sys.argv[i], sys.argv[i + 1])
        checks.finish()
    else:
        raise SystemExit(__doc__)
