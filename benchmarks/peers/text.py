#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Text classification in the style of Made With ML, trained by PyTorch DistributedDataParallel on
CPU (Gloo): the Python peer of examples/text_classifier (benchmarks/vs_text_peer.py runs both).

    tests/tools/venv-python benchmarks/peers/text.py --data DIR [--model transformer|bag]
        [--workers 2] [--global-batch 64] [--epochs 1] [--max-steps 0] [--max-len 128]
        [--vocab 20000] [--seed 0] [--threads-per-worker 1] [--compile]

DIR holds dataset.csv (training and validation) and holdout.csv (test), CSV files with a header row
and at least the columns title, description and tag (scripts/make-text-corpus makes them).

The work, so that another implementation can do the same:
  text        title + " " + description, lower-cased; its tokens are the matches of [a-z0-9]+,
              the first --max-len of them
  labels      the tags of dataset.csv sorted by name, numbered from 0; holdout rows whose tag is not
              among them are left out
  split       for each tag (sorted), its dataset.csv rows in file order, shuffled by
              random.Random(--seed); the first round(20%) go to validation, the rest to training
  vocabulary  the --vocab most frequent tokens of the training split (ties: the token string
              first), numbered from 2 in that order; 0 = padding, 1 = unknown (and the whole of a
              text with no token)
  batches     padded with 0 to the longest text of the batch, with the mask of the padding
  model       Embedding(V, 128, padding_idx 0); transformer: 2 TransformerEncoderLayers (d_model
              128, 4 heads, feed-forward 256, dropout 0.1, batch first) given the mask; bag: none;
              then the mean over the tokens that are not padding and Linear(128, classes)
  training    DDP over N spawned workers, Adam(lr 1e-3), cross-entropy, global batch 64 split
              evenly, DistributedSampler(shuffle, seed 0), torch.manual_seed(--seed)
  evaluation  rank 0, eager, batches of 256: the validation split (loss, accuracy) and holdout.csv
              (accuracy, macro F1), beside the holdout's majority-class share

pipeline_s times reading, splitting, the vocabulary and tokenising, done once in the parent before
the workers start. One JSON line ends the run: final_train_loss (rank 0's last), the evaluation,
the sizes (train_rows, vocab_size, classes), the timing of benchmarks/peers/common.py, "mode"
(eager or compile) and "torch".
"""
import time

START = time.time()  # before the heavy imports: startup_s and wall_s count them

import collections  # noqa: E402
import csv  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

import common  # noqa: E402  (sets the thread variables before torch loads)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

TOKEN = re.compile(r"[a-z0-9]+")
PAD, UNK = 0, 1
VAL_SHARE = 0.2


def read_csv(path):
    """[(text, tag)] of a CSV file with the columns title, description and tag."""
    csv.field_size_limit(sys.maxsize)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = {"title", "description", "tag"} - set(reader.fieldnames or [])
            if missing:
                raise common.UserError("%s has no column %s" % (path, ", ".join(sorted(missing))))
            return [(row["title"] + " " + row["description"], row["tag"]) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise common.UserError("cannot read %s: %s" % (path, e))


def tokens(text, max_len):
    return TOKEN.findall(text.lower())[:max_len]


def stratified_split(rows, tags, seed):
    by_tag = collections.defaultdict(list)
    for row in rows:
        by_tag[row[1]].append(row)
    train, val = [], []
    for tag in tags:
        group = list(by_tag[tag])
        random.Random(seed).shuffle(group)
        cut = round(VAL_SHARE * len(group))
        val += group[:cut]
        train += group[cut:]
    return train, val


def prepare(args):
    """The encoded splits {name: [(ids, label)]}, the vocabulary's size (with PAD and UNK), the tags,
    the holdout's majority-class share, and the seconds it took."""
    t0 = time.time()
    rows = read_csv(os.path.join(args.data, "dataset.csv"))
    holdout = read_csv(os.path.join(args.data, "holdout.csv"))
    tags = sorted({tag for _, tag in rows})
    label = {tag: i for i, tag in enumerate(tags)}
    train, val = stratified_split(rows, tags, args.seed)
    counts = collections.Counter(t for text, _ in train for t in tokens(text, args.max_len))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:args.vocab]
    ids = {tok: i + 2 for i, (tok, _) in enumerate(ranked)}

    def encode(split):
        return [([ids.get(t, UNK) for t in tokens(text, args.max_len)] or [UNK], label[tag])
                for text, tag in split if tag in label]

    data = {"train": encode(train), "val": encode(val), "test": encode(holdout)}
    if not data["train"] or not data["test"]:
        raise common.UserError("%s: no training rows or no holdout row with a known tag" % args.data)
    majority = collections.Counter(y for _, y in data["test"]).most_common(1)[0][1] / len(data["test"])
    return data, len(ids) + 2, tags, majority, time.time() - t0


def collate(batch):
    """(ids padded to the batch's longest, the padding mask, labels)."""
    x = torch.full((len(batch), max(len(ids) for ids, _ in batch)), PAD, dtype=torch.long)
    for i, (ids, _) in enumerate(batch):
        x[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return x, x.eq(PAD), torch.tensor([y for _, y in batch], dtype=torch.long)


class Classifier(nn.Module):
    def __init__(self, vocab, classes, transformer):
        super().__init__()
        self.embedding = nn.Embedding(vocab, 128, padding_idx=PAD)
        self.encoder = None
        if transformer:
            layer = nn.TransformerEncoderLayer(128, 4, dim_feedforward=256, dropout=0.1, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(128, classes)

    def forward(self, ids, pad):
        h = self.embedding(ids)
        if self.encoder is not None:
            h = self.encoder(h, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))


def evaluate(net, rows, classes):
    """Loss, accuracy and macro F1 of `net` on rows."""
    net.eval()
    confusion = torch.zeros(classes, classes, dtype=torch.long)
    loss = 0.0
    with torch.no_grad():
        for x, pad, y in DataLoader(rows, batch_size=256, collate_fn=collate):
            logits = net(x, pad)
            loss += F.cross_entropy(logits, y, reduction="sum").item()
            confusion.index_put_((y, logits.argmax(1)), torch.ones_like(y), accumulate=True)
    net.train()
    hits = confusion.diag().double()
    precision = hits / confusion.sum(0).double().clamp(min=1)
    recall = hits / confusion.sum(1).double().clamp(min=1)
    f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
    return {"loss": loss / max(1, len(rows)), "accuracy": (hits.sum() / confusion.sum().clamp(min=1)).item(),
            "f1_macro": f1.mean().item()}


def worker(rank, args, prepared):
    data, vocab, tags, majority, pipeline_s = prepared
    torch.manual_seed(args.seed)
    model, net = common.distribute(Classifier(vocab, len(tags), args.model == "transformer"), args.compile)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    sampler = DistributedSampler(data["train"], num_replicas=args.workers, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data["train"], batch_size=args.global_batch // args.workers, sampler=sampler,
                        collate_fn=collate)

    def step(batch):
        x, pad, y = batch
        return F.cross_entropy(model(x, pad), y), len(y)

    loop = common.Loop(START)
    loop.train(args, optimizer, loader, sampler, step)
    samples, _, _ = loop.totals()
    if rank != 0:
        return None
    val = evaluate(net, data["val"], len(tags))
    test = evaluate(net, data["test"], len(tags))
    result = {"model": args.model, "workers": args.workers, "global_batch": args.global_batch, "epochs": args.epochs,
              "threads_per_worker": args.threads_per_worker, "pipeline_s": round(pipeline_s, 3),
              "final_train_loss": round(loop.last_loss, 5), "val_loss": round(val["loss"], 5),
              "val_accuracy": round(val["accuracy"], 4), "test_accuracy": round(test["accuracy"], 4),
              "test_f1_macro": round(test["f1_macro"], 4), "majority_baseline": round(majority, 4),
              "vocab_size": vocab, "classes": len(tags), "train_rows": len(data["train"])}
    result.update(loop.timing(samples))
    return result


def main():
    p = common.parser(__doc__, workers=2, global_batch=64)
    p.add_argument("--data", required=True, help="a directory holding dataset.csv and holdout.csv")
    p.add_argument("--model", choices=["transformer", "bag"], default="transformer")
    p.add_argument("--max-len", type=int, default=128, help="tokens kept of each text (default %(default)s)")
    p.add_argument("--vocab", type=int, default=20000, help="words in the vocabulary (default %(default)s)")
    args = p.parse_args()
    common.check(p, args)
    if args.max_len < 1 or args.vocab < 1:
        p.error("--max-len and --vocab must be at least 1")
    for name in ("dataset.csv", "holdout.csv"):
        if not os.path.isfile(os.path.join(args.data, name)):
            common.fail("text.py", "--data %s has no %s (scripts/make-text-corpus DIR makes a corpus)" % (args.data, name))
    try:
        prepared = prepare(args)
    except common.UserError as e:
        common.fail("text.py", str(e))
    common.emit(common.run(worker, args, START, (prepared,)))


if __name__ == "__main__":
    main()
