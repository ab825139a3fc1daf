# SPDX-License-Identifier: Apache-2.0
"""Makes what examples/finetune_llm and benchmarks/llm_peer.py fine-tune, with nothing downloaded:
instruction data from Debian's package index, a byte-level BPE tokenizer trained on it, and a
small Llama with seeded random weights saved by transformers.

    tests/tools/venv-python examples/make_llm.py OUT --corpus DIR [--hidden 64] [--layers 2]
        [--heads 4] [--kv-heads 2] [--intermediate 128] [--vocab 512] [--context 256] [--seed 0]
        [--init-range 0.1]
        [--other-base]

DIR is scripts/make-text-corpus's output. Written:
  OUT/train.jsonl, OUT/eval.jsonl  one record per package of dataset.csv / holdout.csv:
                                   {"prompt": "Describe the Debian package NAME.\\n",
                                    "response": its description}
  OUT/model/                       LlamaForCausalLM.save_pretrained (config.json,
                                   model.safetensors) with tokenizer.json (byte-level BPE trained
                                   on the training records, <|endoftext|> its EOS and padding, no
                                   BOS) and tokenizer_config.json naming them
  OUT/gpt2/                        with --other-base: a GPT2LMHeadModel of the same vocabulary,
                                   a base of another architecture (the example refuses it)
  OUT/other/                       with --other-base: the same Llama config with other weights
                                   (seed + 1), another base of the same architecture
"""
import argparse
import csv
import json
import os
import shutil

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

EOS = "<|endoftext|>"

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("out")
p.add_argument("--corpus", required=True, help="scripts/make-text-corpus's output directory")
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--kv-heads", type=int, default=2)
p.add_argument("--intermediate", type=int, default=128)
p.add_argument("--vocab", type=int, default=512)
p.add_argument("--context", type=int, default=256)
p.add_argument("--seed", type=int, default=0)
# transformers' default 0.02 leaves a random head's logits within about +-1 of each other after
# the final norm, so LoRA on the projections could barely move the loss from ln(vocab); 0.1 gives
# the head a pretrained model's range.
p.add_argument("--init-range", type=float, default=0.1)
p.add_argument("--other-base", action="store_true")
a = p.parse_args()


def records(csv_path):
    with open(csv_path, newline="", encoding="utf-8") as f:
        return [{"prompt": f"Describe the Debian package {row['title']}.\n", "response": row["description"]}
                for row in csv.DictReader(f)]


train = records(os.path.join(a.corpus, "dataset.csv"))
held = records(os.path.join(a.corpus, "holdout.csv"))
os.makedirs(a.out, exist_ok=True)
for name, rows in (("train.jsonl", train), ("eval.jsonl", held)):
    with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.post_processor = processors.ByteLevel(trim_offsets=False)
tok.train_from_iterator((r["prompt"] + r["response"] for r in train),
                        trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=[EOS], show_progress=False,
                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
eos = tok.token_to_id(EOS)


def save(model, target):
    if os.path.isdir(target):
        shutil.rmtree(target)
    model.save_pretrained(target)
    tok.save(os.path.join(target, "tokenizer.json"))
    with open(os.path.join(target, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": EOS, "pad_token": EOS, "bos_token": None, "add_bos_token": False,
                   "model_max_length": a.context, "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)


def llama(seed):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        max_position_embeddings=a.context, bos_token_id=None, eos_token_id=eos, pad_token_id=eos,
        tie_word_embeddings=False, initializer_range=a.init_range))


base = llama(a.seed)
save(base, os.path.join(a.out, "model"))
if a.other_base:
    save(llama(a.seed + 1), os.path.join(a.out, "other"))
    torch.manual_seed(a.seed)
    save(GPT2LMHeadModel(GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=a.context, n_embd=a.hidden,
                                    n_layer=a.layers, n_head=a.heads, bos_token_id=eos, eos_token_id=eos,
                                    pad_token_id=eos)), os.path.join(a.out, "gpt2"))
params = sum(p.numel() for p in base.parameters())
print(f"made {a.out}: {len(train)} train and {len(held)} eval records, vocabulary {tok.get_vocab_size()}, "
      f"Llama {a.layers} layers x {a.hidden}, {params} parameters")
