# SPDX-License-Identifier: Apache-2.0
"""PyTorch DistributedDataParallel peer (CPU, Gloo) of examples/finetune_llm: a Llama causal LM
fine-tuned with LoRA on instruction records through transformers and peft, the same work step for
step. Prints ONE JSON line with the example's keys.

    tests/tools/venv-python benchmarks/llm_peer.py --model-dir DIR --train FILE.jsonl --eval FILE.jsonl
        [--workers 2] [--threads-per-worker 1] [--global-batch 8] [--seq-len 256] [--epochs 1]
        [--max-steps 0] [--lr 2e-4] [--weight-decay 0] [--r 8] [--alpha 16] [--dropout 0.05]
        [--targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj] [--checkpointing 1]
        [--seed 0]

DIR, FILE.jsonl: examples/make_llm.py's OUT/model, OUT/train.jsonl and OUT/eval.jsonl. Runs with the
environment of scripts/python-env (torch, transformers, peft and tokenizers from PyPI). The work,
fixed so that the example can do exactly the same (data::CausalLMData, packed):
  tokens    = tokenizers.Tokenizer.from_file(DIR/tokenizer.json), encode(..., add_special_tokens=
              False); EOS = tokenizer_config.json's eos_token (make_llm.py's <|endoftext|>); a BOS
              only when the tokenizer puts one first (tokenizer_config.json's add_bos_token true
              with a bos_token, or a post-processor that adds a token before the text): none for
              make_llm.py's; pad = tokenizer.json's padding pad_id, else tokenizer_config.json's
              pad_token, else EOS (EOS for make_llm.py's)
  documents = per record in file order: [BOS] prompt response EOS (a record with a "text" and no
              "prompt"/"response": [BOS] text EOS); a prompt part that does not fit with one
              response token in --seq-len is an error; a longer document loses the end of its
              response (EOS included) to be exactly --seq-len. Labels = the ids, -100 on the
              prompt (BOS included) and on each document's first token
  rows      = packed: documents in order, whole, into rows of exactly --seq-len; when the next
              document does not fit, the row is padded (pad id, label -100, positions 0, 1, ...
              as one more document) and a new row starts; the last row padded too. position_ids
              restart at 0 in each document. eval.jsonl alike
  model     = LlamaForCausalLM.from_pretrained(DIR, dtype=float32), peft get_peft_model(LoraConfig(
              r, lora_alpha, lora_dropout, target_modules, bias="none", task_type="CAUSAL_LM")):
              only the adapters train; --checkpointing 1: activation checkpointing of every
              decoder layer (torch.utils.checkpoint, use_reentrant=False); use_cache off
  forward   = model(input_ids, position_ids, labels, use_cache=False) with no attention_mask:
              transformers finds the packed documents from the positions and keeps each one's
              attention to itself; the loss is its mean over the rank's shifted labels != -100
  optimizer = AdamW(lr, weight_decay) over the trainable parameters, a constant lr
  batches   = torch.manual_seed(seed) before the model; DistributedSampler(train rows, shuffle,
              seed, drop_last=False) + DataLoader(global batch / workers), set_epoch per epoch:
              ceil(rows / global batch) steps an epoch; --max-steps N stops after N steps in all
  each epoch: train, then eval over the ranks (rank r takes eval rows r, r + workers, ...): the
              summed token losses and their count all-reduced -> eval_loss, eval_perplexity =
              exp(eval_loss); best_eval_loss the lowest over the epochs
Timing: a barrier before and after each epoch's training loop; train_loop_s their sum (eval not
counted); train_tokens = rows trained by all ranks (the sampler's padding included) * seq_len;
train_tokens_per_s = train_tokens / train_loop_s; startup_s = script start -> the first step done;
final_train_loss = rank 0's loss of the last step.
"""
import time

_SCRIPT_START = time.time()

import os as _os
import sys as _sys

_threads = "1"
for _i, _a in enumerate(_sys.argv):
    if _a == "--threads-per-worker" and _i + 1 < len(_sys.argv):
        _threads = _sys.argv[_i + 1]
_os.environ.setdefault("OPENBLAS_NUM_THREADS", _threads)
_os.environ.setdefault("OMP_NUM_THREADS", _threads)
_os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the driver tokenises; workers are spawned
_os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse
import json
import math
import os
import socket
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


class Tokens:
    """The model directory's tokenizer as data::CausalLMData uses it: encode without special tokens,
    the BOS a document starts with (if any), the EOS it ends with, the pad id."""

    def __init__(self, model_dir):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        config_path = os.path.join(model_dir, "tokenizer_config.json")
        config = {}
        if os.path.isfile(config_path):
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)

        def named(key):
            token = config.get(key)
            if isinstance(token, dict):  # an AddedToken written out: {"content": ..., ...}
                token = token.get("content")
            if not isinstance(token, str):
                return None
            i = self.tok.token_to_id(token)
            if i is None:
                raise SystemExit("llm_peer: %s %r of %s is not a token of the tokenizer" % (key, token, config_path))
            return i

        # What the post-processor puts before the text (a template's BOS), as dtrain reads it.
        plain = self.tok.encode("a", add_special_tokens=False).ids
        full = self.tok.encode("a").ids
        begin = []
        for k in range(len(full) - len(plain) + 1):
            if full[k:k + len(plain)] == plain:
                begin = full[:k]
                break
        self.eos = named("eos_token")
        if self.eos is None:
            raise SystemExit("llm_peer: %s names no eos_token; a document ends with one" % config_path)
        bos = named("bos_token")
        if bos is None and begin:
            bos = begin[0]
        add_bos = (config.get("add_bos_token") is True and bos is not None) or bool(begin)
        self.begin = [bos] if add_bos and bos is not None else []
        padding = self.tok.padding
        if padding:
            self.pad = padding["pad_id"]
        else:
            pad = named("pad_token")
            self.pad = self.eos if pad is None else pad

    def encode(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)] if texts else []


def read_records(path):
    with open(path, encoding="utf-8") as f:
        out = []
        for n, line in enumerate(f, 1):
            if line.strip():
                r = json.loads(line)
                if "prompt" in r and "response" in r:
                    out.append(("%s:%d" % (path, n), r["prompt"], r["response"]))
                elif "text" in r:
                    out.append(("%s:%d" % (path, n), None, r["text"]))
                else:
                    raise SystemExit('llm_peer: %s:%d: the record has neither "prompt" and "response" nor "text"' % (path, n))
    if not out:
        raise SystemExit("llm_peer: %s: no records" % path)
    return out


def causal_lm_rows(path, tokens, seq_len):
    """data::CausalLMData's packed rows of a file: (ids, labels, positions) [rows, seq_len], the
    documents, the label tokens and the truncated documents."""
    records = read_records(path)
    prompts = tokens.encode([p for _, p, _ in records if p is not None])
    responses = tokens.encode([r for _, _, r in records])
    docs, label_tokens, truncated, k = [], 0, 0, 0
    for (where, p, _), response in zip(records, responses):
        prompt = tokens.begin + (prompts[k] if p is not None else [])
        k += p is not None
        response = response + [tokens.eos]
        if len(prompt) + 1 > seq_len:
            raise SystemExit("llm_peer: %s: the prompt is %d tokens and --seq-len %d; a document needs its prompt and "
                             "at least one response token within it" % (where, len(prompt), seq_len))
        if len(prompt) + len(response) > seq_len:
            response = response[:seq_len - len(prompt)]
            truncated += 1
        ids = prompt + response
        labels = [-100] * len(prompt) + response
        labels[0] = -100  # nothing before a document predicts its first token
        label_tokens += sum(1 for l in labels[1:] if l != -100)
        docs.append((ids, labels))
    rows, row = [], ([], [], [])

    def flush():
        p = 0
        while len(row[0]) < seq_len:
            row[0].append(tokens.pad)
            row[1].append(-100)
            row[2].append(p)
            p += 1
        rows.append(row)

    for ids, labels in docs:
        if len(row[0]) + len(ids) > seq_len:
            flush()
            row = ([], [], [])
        row[0].extend(ids)
        row[1].extend(labels)
        row[2].extend(range(len(ids)))
    if row[0]:
        flush()
    ids, labels, positions = (torch.tensor([r[i] for r in rows], dtype=torch.long) for i in range(3))
    return {"ids": ids, "labels": labels, "positions": positions, "documents": len(docs),
            "label_tokens": label_tokens, "truncated": truncated}


def prepare(args):
    tokens = Tokens(args.model_dir)
    return {name: causal_lm_rows(path, tokens, args.seq_len) for name, path in (("train", args.train), ("eval", args.eval))}


def build_model(args):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model.config.use_cache = False
    if args.checkpointing:
        # transformers 5 names it activation_checkpointing_enable (gradient_checkpointing_enable its
        # deprecated alias); either also makes the embeddings' output require grad, for the frozen base.
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
    alpha = int(args.alpha) if float(args.alpha).is_integer() else args.alpha
    config = LoraConfig(r=args.r, lora_alpha=alpha, lora_dropout=args.dropout,
                        target_modules=[t for t in args.targets.split(",") if t], bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    model.config.use_cache = False
    return model


def worker(rank, args, port, data, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(args.threads_per_worker)
    warnings.filterwarnings("ignore", category=FutureWarning)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    torch.manual_seed(args.seed)
    peft_model = build_model(args)
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    model = DDP(peft_model)
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=args.weight_decay)
    train, held = data["train"], data["eval"]
    train_set = TensorDataset(train["ids"], train["labels"], train["positions"])
    per_worker = args.global_batch // args.workers
    sampler = DistributedSampler(train_set, num_replicas=args.workers, rank=rank, shuffle=True, seed=args.seed,
                                 drop_last=False)
    loader = DataLoader(train_set, batch_size=per_worker, sampler=sampler)
    # Eval over the ranks: rank r takes rows r, r + workers, ...; sums all-reduced.
    eval_set = TensorDataset(held["ids"][rank::args.workers], held["labels"][rank::args.workers],
                             held["positions"][rank::args.workers])
    eval_loader = DataLoader(eval_set, batch_size=per_worker)
    steps = rows = 0
    first_step = None
    last_loss = float("nan")
    loop_s = 0.0
    eval_loss = best = float("inf")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        dist.barrier()
        t0 = time.time()
        for ids, labels, positions in loader:
            optimizer.zero_grad()
            loss = model(input_ids=ids, position_ids=positions, labels=labels, use_cache=False).loss
            loss.backward()
            optimizer.step()
            if first_step is None:
                first_step = time.time()
            steps += 1
            rows += len(ids)
            last_loss = loss.item()
            if args.max_steps and steps >= args.max_steps:
                break
        dist.barrier()
        loop_s += time.time() - t0
        model.eval()
        sums = torch.zeros(2, dtype=torch.float64)  # token losses, tokens
        with torch.no_grad():
            for ids, labels, positions in eval_loader:
                logits = model.module(input_ids=ids, position_ids=positions, use_cache=False).logits
                shifted = labels[:, 1:]
                sums[0] += nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                                       shifted.reshape(-1), ignore_index=-100, reduction="sum").item()
                sums[1] += shifted.ne(-100).sum().item()
        dist.all_reduce(sums)
        eval_loss = (sums[0] / sums[1]).item()
        best = min(best, eval_loss)
        if args.max_steps and steps >= args.max_steps:
            break
    total = torch.tensor([float(rows)], dtype=torch.float64)
    dist.all_reduce(total)
    if rank == 0:
        train_tokens = int(total.item()) * args.seq_len
        queue.put({"model": "llama-lora", "workers": args.workers, "global_batch": args.global_batch,
                   "seq_len": args.seq_len, "epochs": args.epochs, "steps": steps, "train_rows": len(train["ids"]),
                   "train_documents": train["documents"], "train_label_tokens": train["label_tokens"],
                   "eval_rows": len(held["ids"]), "eval_documents": held["documents"],
                   "trainable_parameters": sum(p.numel() for p in trainable),
                   "total_parameters": sum(p.numel() for p in peft_model.parameters()),
                   "train_tokens": train_tokens, "train_loop_s": round(loop_s, 3),
                   "train_tokens_per_s": round(train_tokens / loop_s, 2), "final_train_loss": round(last_loss, 5),
                   "eval_loss": round(eval_loss, 5), "eval_perplexity": round(math.exp(eval_loss), 4),
                   "best_eval_loss": round(best, 5), "checkpointing": args.checkpointing,
                   "startup_s": round(first_step - _SCRIPT_START, 3)})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True, help="a Hugging Face Llama directory with tokenizer.json")
    p.add_argument("--train", required=True, help="JSON Lines of prompt/response records")
    p.add_argument("--eval", required=True, help="JSON Lines of prompt/response records")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads-per-worker", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--r", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16)
    p.add_argument("--dropout", type=float, default=0.05)
    p.add_argument("--targets", default=TARGETS, help="comma-separated module names that get adapters")
    p.add_argument("--checkpointing", type=int, choices=(0, 1), default=1, help="activation checkpointing (1: on)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.workers < 1 or args.global_batch % args.workers:
        p.error("--global-batch must be divisible by --workers")
    if args.seq_len < 2:
        p.error("--seq-len must be at least 2")
    data = prepare(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(args, port, data, queue), nprocs=args.workers, join=True)
    result = queue.get()
    result["wall_s"] = round(time.time() - _SCRIPT_START, 3)
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
