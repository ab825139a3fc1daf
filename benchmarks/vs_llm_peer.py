#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""examples/finetune_llm against benchmarks/llm_peer.py, side by side in one run: a Llama fine-tuned
with LoRA on instruction records by dtrain and by PyTorch DDP over transformers and peft.

    benchmarks/vs_llm_peer.py --model-dir DIR --train FILE.jsonl --eval FILE.jsonl
                              [--example build/examples/finetune_llm] [--python tests/tools/venv-python]
                              [--repeats 1] [--workers 2] [--threads-per-worker 1] [--global-batch 8]
                              [--seq-len 256] [--epochs 1] [--max-steps 0] [--lr 2e-4] [--r 8]
                              [--alpha 16] [--dropout 0.05] [--checkpointing 1] [--seed 0]
                              [--weight-decay X] [--targets LIST] [--compare-checkpointing]
                              [--json FILE] [--allow-load]

DIR, FILE.jsonl: examples/make_llm.py's OUT/model, OUT/train.jsonl and OUT/eval.jsonl. The peer (run
by the environment of scripts/python-env: tests/tools/venv-python) and dtrain run alternately,
`repeats` times each, with the same flags (the example also gets a fresh --storage-path and --name
vs_llm each run); each figure is the median of its runs. Reported: training tokens/s (the issue's
target: dtrain >= 1.3x the peer), eval loss of each and their relative difference (target: within
2 %), and peak memory: the largest sum of the resident sets of the run's whole process tree (the
driver and its workers), sampled every 0.1 s from /proc, and the largest single process's VmHWM.
Steps, train rows and train label tokens must agree (a note says when they do not; so do the
documents, eval rows and trainable parameters).

--compare-checkpointing (or --memory): the example alone, with --checkpointing 0 and 1 alternately
(every other flag the same), `repeats` times each: the peak memory of each and the reduction with
checkpointing in percent (the issue's target: >= 40 % lower peak RSS of the process tree), with
tokens/s and eval loss (which checkpointing should not change). --checkpointing-side peer runs the
peer that way instead (a reference).

Each run records the other processes' share of the machine (benchmarks/idle.py): the script waits
for a quiet machine first, and exits 3 after printing when a run was loaded (--allow-load: marked).
--json FILE writes every run's JSON line and the picked figures.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

import idle
import timed_build
import process_tree

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.normpath(os.path.join(here, ".."))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--model-dir", required=True, help="a Hugging Face Llama directory (examples/make_llm.py's OUT/model)")
p.add_argument("--train", required=True, help="JSON Lines of prompt/response records (OUT/train.jsonl)")
p.add_argument("--eval", required=True, help="JSON Lines of prompt/response records (OUT/eval.jsonl)")
p.add_argument("--example", type=timed_build.program,
               default=os.path.join(root, "build", "examples", "finetune_llm"))
p.add_argument("--python", default=os.path.join(root, "tests", "tools", "venv-python"),
               help="the Python that runs the peer (torch, transformers, peft, tokenizers)")
p.add_argument("--peer", default=os.path.join(here, "llm_peer.py"))
p.add_argument("--repeats", type=int, default=1)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--threads-per-worker", type=int, default=1)
p.add_argument("--global-batch", type=int, default=8)
p.add_argument("--seq-len", type=int, default=256)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--max-steps", type=int, default=0)
p.add_argument("--lr", type=float, default=2e-4)
p.add_argument("--r", type=int, default=8)
p.add_argument("--alpha", type=float, default=16)
p.add_argument("--dropout", type=float, default=0.05)
p.add_argument("--checkpointing", type=int, choices=(0, 1), default=1)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--weight-decay", type=float, default=None, help="passed to both sides when given (their default: 0)")
p.add_argument("--targets", default=None, help="passed to both sides when given (their default: every projection)")
p.add_argument("--compare-checkpointing", "--memory", action="store_true",
               help="run one side with --checkpointing 0 and 1 and report the peak memory of each")
p.add_argument("--checkpointing-side", choices=("dtrain", "peer"), default="dtrain",
               help="the side --compare-checkpointing runs (default: dtrain, the example)")
p.add_argument("--json", help="also write every run's JSON line and the picked figures to this file")
idle.add_argument(p)
args = p.parse_args()

for path, what in ((os.path.join(args.model_dir, "config.json"), "the model's config.json"),
                   (os.path.join(args.model_dir, "tokenizer.json"), "the model's tokenizer.json"),
                   (args.train, "--train"), (args.eval, "--eval")):
    if not os.path.isfile(path):
        sys.exit("vs_llm_peer: %s (%s) does not exist; make the data and model with tests/tools/venv-python "
                 "examples/make_llm.py OUT --corpus DIR" % (path, what))
needs_example = not (args.compare_checkpointing and args.checkpointing_side == "peer")
if needs_example and not os.path.isfile(args.example):
    sys.exit("vs_llm_peer: --example %s does not exist; build it: cmake --build build --target finetune_llm" % args.example)
if args.repeats < 1:
    sys.exit("vs_llm_peer: --repeats must be at least 1")

env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads_per_worker), OMP_NUM_THREADS=str(args.threads_per_worker),
           HF_HUB_DISABLE_PROGRESS_BARS="1", TOKENIZERS_PARALLELISM="false")
env.pop("FINETUNE_LLM_START", None)  # the example's start time is its own


def num(x):
    """A number as a flag: 16 rather than 16.0, 0.0002 as repr writes it."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def flags(checkpointing):
    out = ["--model-dir", args.model_dir, "--train", args.train, "--eval", args.eval, "--workers", str(args.workers),
           "--threads-per-worker", str(args.threads_per_worker), "--global-batch", str(args.global_batch),
           "--seq-len", str(args.seq_len), "--epochs", str(args.epochs), "--max-steps", str(args.max_steps),
           "--lr", num(args.lr), "--r", str(args.r), "--alpha", num(args.alpha), "--dropout", num(args.dropout),
           "--checkpointing", str(checkpointing), "--seed", str(args.seed)]
    if args.weight_decay is not None:
        out += ["--weight-decay", num(args.weight_decay)]
    if args.targets is not None:
        out += ["--targets", args.targets]
    return out


loads = []


def run(side, checkpointing):
    """One run of `side` ("peer" or "dtrain"): its JSON line with memory and load (process_tree)."""
    if side == "peer":
        result = process_tree.measured([args.python, args.peer] + flags(checkpointing), env, "vs_llm_peer")
    else:
        storage = tempfile.mkdtemp(prefix="vs_llm_")  # fresh each run: the example starts from nothing
        try:
            result = process_tree.measured([args.example] + flags(checkpointing) + ["--storage-path", storage,
                                                                                     "--name", "vs_llm"],
                                           env, "vs_llm_peer")
        finally:
            shutil.rmtree(storage, ignore_errors=True)
    loads.append(result["load"])
    return result


def median(runs, key):
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else float("nan")


def table_row(label, a, b, note, digits=2):
    print("| %-36s | %12.*f | %12.*f | %-28s |" % (label, digits, a, digits, b, note))


record = {"args": vars(args), "mode": "compare_checkpointing" if args.compare_checkpointing else "vs_peer",
          "picked": {}, "notes": []}
idle.wait(args.allow_load)

if not args.compare_checkpointing:
    record["runs"] = {"peer": [], "dtrain": []}
    peer, ours = record["runs"]["peer"], record["runs"]["dtrain"]
    for i in range(args.repeats):
        peer.append(run("peer", args.checkpointing))
        ours.append(run("dtrain", args.checkpointing))
        print("run %d/%d: tokens/s peer %.0f dtrain %.0f | eval loss peer %.5f dtrain %.5f | peak MiB peer %.0f "
              "dtrain %.0f | others %.1f%% %.1f%%" % (i + 1, args.repeats, peer[-1]["train_tokens_per_s"],
                                                    ours[-1]["train_tokens_per_s"], peer[-1]["eval_loss"],
                                                    ours[-1]["eval_loss"], peer[-1]["peak_rss_sum_mb"],
                                                    ours[-1]["peak_rss_sum_mb"], 100 * peer[-1]["load"]["others_share"],
                                                    100 * ours[-1]["load"]["others_share"]), flush=True)
    # What must agree (the same work), then what should (the same data and adapters).
    for key in ["steps", "train_rows", "train_label_tokens", "train_documents", "eval_rows", "eval_documents",
                "train_tokens", "trainable_parameters", "total_parameters", "seq_len", "global_batch", "workers",
                "checkpointing"]:
        if peer[0].get(key) != ours[0].get(key):
            note = "%s differs: peer %s, dtrain %s" % (key, peer[0].get(key), ours[0].get(key))
            record["notes"].append(note)
            print("  note: " + note)
    record["same_work"] = all(peer[0].get(k) == ours[0].get(k) for k in ("steps", "train_rows", "train_label_tokens"))

    print("\nLlama + LoRA (r %d), %d worker(s) x %d thread(s), global batch %d x %d tokens, checkpointing %d, %s "
          "step(s), median of %d run(s) each, interleaved"
          % (args.r, args.workers, args.threads_per_worker, args.global_batch, args.seq_len, args.checkpointing,
             ours[0].get("steps"), args.repeats))
    print("| %-36s | %12s | %12s | %-28s |" % ("", "peer", "dtrain", "dtrain vs peer"))
    print("| %s | %s | %s | %s |" % ("-" * 36, "-" * 12, "-" * 12, "-" * 28))
    for key, label, higher in [("train_tokens_per_s", "training tokens/s", True),
                               ("train_loop_s", "training loop s", False),
                               ("startup_s", "startup s (start -> first step)", False), ("wall_s", "wall s", False),
                               ("peak_rss_sum_mb", "peak RSS, all processes (MiB)", False),
                               ("max_process_hwm_mb", "largest process's peak RSS (MiB)", False)]:
        a, b = median(peer, key), median(ours, key)
        ratio = (b / a if higher else a / b) if a and b else float("nan")
        record["picked"][key] = {"peer": a, "dtrain": b, "ratio": ratio}
        note = " (target >= 1.3x)" if key == "train_tokens_per_s" else (" less" if "MiB" in label else " faster")
        table_row(label, a, b, "x%.2f%s" % (ratio, note))
    for key in ["eval_loss", "eval_perplexity", "best_eval_loss", "final_train_loss"]:
        a, b = median(peer, key), median(ours, key)
        rel = (b - a) / a if a else float("nan")
        record["picked"][key] = {"peer": a, "dtrain": b, "relative_difference": rel}
        table_row(key, a, b, "%+.2f%%%s" % (100 * rel, " (target within 2%)" if key == "eval_loss" else ""), 5)
    speed = record["picked"]["train_tokens_per_s"]["ratio"]
    loss = record["picked"]["eval_loss"]["relative_difference"]
    record["targets"] = {"tokens_per_s_ratio": {"value": speed, "target": 1.3, "met": speed >= 1.3},
                         "eval_loss_relative_difference": {"value": loss, "target": 0.02, "met": abs(loss) <= 0.02},
                         "same_work": record["same_work"]}
    print("\ntargets: tokens/s x%.2f (>= 1.3: %s), eval loss %+.2f%% (within 2%%: %s), same steps/rows/label tokens: %s"
          % (speed, "met" if speed >= 1.3 else "MISSED", 100 * loss, "met" if abs(loss) <= 0.02 else "MISSED",
             "yes" if record["same_work"] else "NO"), flush=True)
else:
    side = args.checkpointing_side
    record["runs"] = {"checkpointing_0": [], "checkpointing_1": []}
    off, on = record["runs"]["checkpointing_0"], record["runs"]["checkpointing_1"]
    for i in range(args.repeats):
        off.append(run(side, 0))
        on.append(run(side, 1))
        print("run %d/%d (%s): peak MiB checkpointing 0 %.0f, 1 %.0f | tokens/s %.0f %.0f | others %.1f%% %.1f%%"
              % (i + 1, args.repeats, side, off[-1]["peak_rss_sum_mb"], on[-1]["peak_rss_sum_mb"],
                 off[-1]["train_tokens_per_s"], on[-1]["train_tokens_per_s"], 100 * off[-1]["load"]["others_share"],
                 100 * on[-1]["load"]["others_share"]), flush=True)
    for key in ["steps", "train_rows", "train_label_tokens"]:
        if off[0].get(key) != on[0].get(key):
            note = "%s differs: checkpointing 0 %s, 1 %s" % (key, off[0].get(key), on[0].get(key))
            record["notes"].append(note)
            print("  note: " + note)
    for r, want in ((off[0], 0), (on[0], 1)):
        if "checkpointing" in r and r["checkpointing"] != want:
            note = "the run given --checkpointing %d reports checkpointing %s" % (want, r["checkpointing"])
            record["notes"].append(note)
            print("  note: " + note)

    print("\n%s, Llama + LoRA (r %d), %d worker(s) x %d thread(s), global batch %d x %d tokens, %s step(s), "
          "activation checkpointing off and on, median of %d run(s) each, interleaved"
          % ("dtrain (%s)" % os.path.basename(args.example) if side == "dtrain" else "peer (llm_peer.py)", args.r,
             args.workers, args.threads_per_worker, args.global_batch, args.seq_len, on[0].get("steps"), args.repeats))
    print("| %-36s | %12s | %12s | %-28s |" % ("", "off (0)", "on (1)", "on vs off"))
    print("| %s | %s | %s | %s |" % ("-" * 36, "-" * 12, "-" * 12, "-" * 28))
    for key, label in [("peak_rss_sum_mb", "peak RSS, all processes (MiB)"),
                       ("max_process_hwm_mb", "largest process's peak RSS (MiB)")]:
        a, b = median(off, key), median(on, key)
        reduction = (a - b) / a if a else float("nan")
        record["picked"][key] = {"checkpointing_0": a, "checkpointing_1": b, "reduction": reduction}
        table_row(label, a, b, "%.1f%% lower%s" % (100 * reduction, " (target >= 40%)" if key == "peak_rss_sum_mb" else ""))
    for key, label, digits in [("train_tokens_per_s", "training tokens/s", 2), ("train_loop_s", "training loop s", 2),
                               ("eval_loss", "eval_loss", 5)]:
        a, b = median(off, key), median(on, key)
        rel = (b - a) / a if a else float("nan")
        record["picked"][key] = {"checkpointing_0": a, "checkpointing_1": b, "relative_difference": rel}
        table_row(label, a, b, "%+.2f%%" % (100 * rel), digits)
    reduction = record["picked"]["peak_rss_sum_mb"]["reduction"]
    record["targets"] = {"peak_rss_reduction": {"value": reduction, "target": 0.4, "met": reduction >= 0.4}}
    print("\ntarget: peak RSS %.1f%% lower with checkpointing (>= 40%%: %s)"
          % (100 * reduction, "met" if reduction >= 0.4 else "MISSED"), flush=True)
print(flush=True)

record["load"] = idle.verdict(loads)
if args.json:
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
idle.refuse(record["load"], args.allow_load)
