#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Batch inference on N workers, as a user runs it (tests/inference/scenarios.cpp):

    check_batch_predict.py SCENARIOS WORKDIR

- a trained checkpoint carries model_config.json (ctx.checkpoint saved the model's Config);
- batch_predict on 1, 2 and 3 workers writes the same file, byte for byte, equal to one process's
  Predictor over the same samples: every sample once, in the dataset's order;
- JSON Lines carry the same predictions;
- a worker SIGKILLed midway is restarted, the parts written before are not scored again, and the
  final file is complete with no duplicate;
- a program that trains and then scores, its workers started anew (not forks), runs each fit() once;
- another job's output directory is refused, naming both jobs;
- the library's own nn::BertForSequenceClassification, fine-tuned with a WordPiece tokenizer, is
  served from its checkpoint alone over raw texts with TextInputs{} (no type named): batch_predict
  on 2 workers equals one process's Predictor byte for byte, whose logits are the model's; a job
  whose tokenizer object is missing fails at once (no restart), in the job's words.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tracking"))
from page_checks import check, finish  # noqa: E402

scenarios, workdir = sys.argv[1], sys.argv[2]
shutil.rmtree(workdir, ignore_errors=True)
os.makedirs(workdir)
SAMPLES, PART = 1003, 49


def run(*args, expect=0):
    p = subprocess.run([scenarios, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    sys.stderr.write(p.stderr[-3000:])
    if p.returncode != expect:
        sys.exit("FAIL %s exited with %d, not %d" % (" ".join(args), p.returncode, expect))
    return p


def word_after(text, word):
    parts = text.split()
    return parts[parts.index(word) + 1]


out = run("train", os.path.join(workdir, "train")).stdout
checkpoint = word_after(out, "CHECKPOINT")
cfg = json.load(open(os.path.join(checkpoint, "model_config.json")))
check(cfg["format"] == 1 and "NetImpl" in cfg["model"] and cfg["config"] == {"inputs": 8, "hidden": 16, "classes": 4},
      "the checkpoint says how its model was built: %s" % cfg)
manifest = json.load(open(os.path.join(checkpoint, "manifest.json")))
check("model_config.json" in [f["name"] for f in manifest["files"]], "the manifest covers model_config.json")

reference = run("reference", checkpoint).stdout
lines = reference.splitlines()
check(len(lines) == SAMPLES + 1 and lines[0].startswith("index,label,class_index,probability,p_cold"),
      "the reference: a header and %d rows" % SAMPLES)

for n in (1, 2, 3):
    output = os.path.join(workdir, "csv%d" % n)
    p = run("predict", checkpoint, output, str(n))
    check("samples %d restarts 0 status finished" % SAMPLES in p.stdout, "%d workers: %s" % (n, p.stdout.strip()))
    got = open(os.path.join(output, "predictions.csv")).read()
    check(got == reference, "%d workers: predictions.csv equals one process's Predictor byte for byte" % n)
    m = json.load(open(os.path.join(output, "manifest.json")))
    check(m["samples"] == SAMPLES and m["class_names"] == ["cold", "cool", "mild", "warm"], "%d workers: manifest" % n)
    model_crc = [f["crc32"] for f in manifest["files"] if f["name"] == "model.pt"]
    check(m["job"]["model_crc32"] == model_crc[0] and m["job"]["part_size"] == PART,
          "%d workers: the job names the checkpoint's model file: %s" % (n, m["job"]))
    check([(q["first"], q["count"]) for q in m["parts"]] ==
          [(f, min(PART, SAMPLES - f)) for f in range(0, SAMPLES, PART)], "%d workers: the parts cover the samples in order" % n)
    check(not [f for f in os.listdir(os.path.join(output, "parts")) if f.endswith(".tmp")], "no temporary file is left")

output = os.path.join(workdir, "jsonl")
run("predict", checkpoint, output, "2", "--jsonl")
rows = [json.loads(l) for l in open(os.path.join(output, "predictions.jsonl"))]
csv_rows = [l.split(",") for l in lines[1:]]
check([r["index"] for r in rows] == list(range(SAMPLES)), "JSON Lines: every sample once, in order")
check(all(r["label"] == c[1] and r["class_index"] == int(c[2]) and r["probabilities"] == [float(x) for x in c[4:]]
          for r, c in zip(rows, csv_rows)), "JSON Lines: the CSV's predictions")

# A batch of 40 with every other option its default: the part size is the largest multiple of 40 up
# to 4096 (it was 4096, refused for this batch).
output = os.path.join(workdir, "batch40")
p = run("predict", checkpoint, output, "2", "--batch", "40")
check("samples %d restarts 0 status finished" % SAMPLES in p.stdout, "batch 40, default part size: %s" % p.stdout.strip())
m = json.load(open(os.path.join(output, "manifest.json")))
check(m["job"]["part_size"] == 4080 and [q["count"] for q in m["parts"]] == [SAMPLES],
      "batch 40: one part of 4080 samples at most: %s" % m["job"])
got = [l.split(",")[:3] for l in open(os.path.join(output, "predictions.csv")).read().splitlines()]
check(len(got) == SAMPLES + 1 and [int(r[0]) for r in got[1:]] == list(range(SAMPLES)), "batch 40: every sample once, in order")

# A worker killed in the middle of part 10 (samples 490..538, read 7 at a time; rank 0 of 2 scores it
# in round 5).
output, log = os.path.join(workdir, "killed"), os.path.join(workdir, "killed.log")
p = run("predict", checkpoint, output, "2", "--kill-at", "504", "--log", log)
check("restarts 1 status finished" in p.stdout, "the killed group was restarted once and finished: " + p.stdout.strip())
check(open(os.path.join(output, "predictions.csv")).read() == reference, "after the kill: the complete file, equal to the reference")
reads = [tuple(map(int, l.split())) for l in open(log)]
again = sorted({first // PART for attempt, first, _ in reads if attempt == 1})
check(again and all(part >= 10 for part in again), "the restarted group scored only parts 10 and later: %s" % again)
check(any(attempt == 0 and first // PART == 9 for attempt, first, _ in reads), "parts before the kill were scored in attempt 0")

# Training, then batch inference, in one program whose workers run it from the start.
output = os.path.join(workdir, "both_out")
p = run("train-then-predict", os.path.join(workdir, "both"), output)
check("samples %d" % SAMPLES in p.stdout, "train-then-predict: " + p.stdout.strip())
check(len(open(os.path.join(output, "predictions.csv")).read().splitlines()) == SAMPLES + 1, "train-then-predict: every row")
outcome = json.load(open(os.path.join(workdir, "both", "train", "outcome.json")))
check(outcome["status"] == "finished" and len(outcome["groups"]) == 1, "the training ran once: %s" % outcome["groups"])

# Another checkpoint into the first job's directory: refused before anything is scored.
other = os.path.join(workdir, "both", "train")
ck2 = sorted(d for d in os.listdir(other) if d.startswith("checkpoint_0"))[-1]
p = run("predict", os.path.join(other, ck2), os.path.join(workdir, "csv1"), "1", expect=1)
check("holds the predictions of another job" in p.stderr, "another job's output is refused: " + p.stderr.strip()[-300:])
# The library's BERT with a WordPiece tokenizer, served from its checkpoint alone.
p = run("text", os.path.join(workdir, "text"), os.path.join(workdir, "text_out"))
text_checkpoint = word_after(p.stdout, "CHECKPOINT")
check("samples 103 restarts 0 status finished" in p.stdout, "text: batch_predict over raw texts: " + p.stdout.strip())
ref = subprocess.run([scenarios, "text-reference", text_checkpoint], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
check(ref.returncode == 0, "text: one process's Predictor: " + ref.stderr[-1000:])
check("LOGITS equal SOFTMAX equal" in ref.stderr, "text: Predictions::logits() are the model's, the probabilities their softmax")
got = open(os.path.join(workdir, "text_out", "predictions.csv")).read()
check(got == ref.stdout and len(got.splitlines()) == 104, "text: predictions.csv equals one process's Predictor byte for byte")
bad = [l for l in p.stdout.splitlines() if l.startswith("BAD ")]
check("BAD status failed restarts 0" in bad, "text: a missing tokenizer object fails the job at once, not restarted: %s" % bad)
message = " ".join(bad)
check("batch prediction failed" in message and "training failed" not in message and
      'has no object "tokenizer"' in message and "not restarted" in message,
      "text: the failure speaks of the job and names the object: " + message[:400])
finish()
