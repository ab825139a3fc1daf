#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""examples/image_classifier against the Python peer benchmarks/peers/images.py, side by side in one run.

    benchmarks/vs_image_peer.py --root DIR [--example build/examples/image_classifier]
        [--peer benchmarks/peers/images.py] [--python tests/tools/venv-python]
        [--peer-mode eager|compile|both] [--decode-steps 100] [--train-steps 60]
        [--loader-threads 0,1] [--repeats 1] [--width 16] [--workers 2] [--global-batch 128]
        [--weights FILE]

DIR is an image folder (scripts/make-image-folder DIR). On the same folder, alternately:
  1. the input pipeline alone (--decode-only, global batch 128 over the workers, --decode-steps
     batches per worker): the peer decoding in its training processes (--loader-workers 0) against
     dtrain with each count of --loader-threads (0 = on the training thread); images/s in all and
     per loader (a count of 0 counts as 1: the training process decodes);
  2. training (ResNet-18 at --width, SGD + cosine, global batch 128, --train-steps steps, one
     intra-op thread and one BLAS thread per worker): the peer (decoding in the training process;
     in eager mode, under torch.compile, or both with --peer-mode: its compilation counts in its
     loop, and the ratios are to the faster mode), dtrain fp32 and dtrain bf16 (1 loader thread
     each) - samples/s, startup, test accuracy on the whole test folder, peak memory (the largest
     sum of the resident sets of the run's process tree, sampled every 0.1 s:
     benchmarks/process_tree.py).
With --weights FILE (a torchvision resnet18 state_dict with the small-image stem:
examples/torchvision_resnet18.py) both sides start from FILE: the example with --weights, the peer is
benchmarks/resnet_peer.py (torchvision.models.resnet18, the same stem and FILE; eager only, run by
/usr/bin/python3 unless --python is given) unless --peer is given; the width is torchvision's 64 and
the input pipeline alone is not measured. Otherwise --python (default tests/tools/venv-python: the
environment of scripts/python-env, torch 2.x) runs the peer.
Medians over --repeats; the ratios are dtrain / peer. One JSON line with every figure ends the
output.
"""
import argparse
import json
import os
import statistics
import sys

import idle
import timed_build
import process_tree

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--root", required=True)
p.add_argument("--example", type=timed_build.program,
               default=os.path.join(here, "..", "build", "examples", "image_classifier"))
p.add_argument("--peer", help="default: benchmarks/peers/images.py; with --weights, benchmarks/resnet_peer.py")
p.add_argument("--python", help="the Python that runs the peer (default: tests/tools/venv-python; with --weights "
                                "and no --peer, /usr/bin/python3)")
p.add_argument("--peer-mode", choices=["eager", "compile", "both"], default="eager",
               help="train the peer in eager mode, under torch.compile (--compile), or both")
p.add_argument("--decode-steps", type=int, default=100)
p.add_argument("--train-steps", type=int, default=60)
p.add_argument("--loader-threads", default="0,1")
p.add_argument("--repeats", type=int, default=1)
p.add_argument("--width", type=int, default=16)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--global-batch", type=int, default=128)
p.add_argument("--weights", help="a torchvision resnet18 state_dict both sides start from")
p.add_argument("--storage-path", default="/tmp/dtrain_image_bench")
idle.add_argument(p)
args = p.parse_args()
if args.weights:
    if not os.path.isfile(args.weights):
        sys.exit("vs_image_peer: --weights %s: no such file; make one with examples/torchvision_resnet18.py %s"
                 % (args.weights, args.weights))
    args.width = 64
resnet_peer = args.weights and not args.peer
if resnet_peer and args.peer_mode != "eager":
    sys.exit("vs_image_peer: --peer-mode %s: benchmarks/resnet_peer.py (the peer with --weights) trains in eager "
             "mode only" % args.peer_mode)
args.peer = args.peer or os.path.join(here, "resnet_peer.py" if args.weights else os.path.join("peers", "images.py"))
args.python = args.python or ("/usr/bin/python3" if resnet_peer else
                              os.path.join(here, "..", "tests", "tools", "venv-python"))
if not os.path.isfile(args.peer):
    sys.exit("vs_image_peer: --peer %s does not exist" % args.peer)
if not os.access(args.python, os.X_OK):
    sys.exit("vs_image_peer: --python %s is not a program (scripts/python-env makes the default)" % args.python)
if not os.path.isdir(os.path.join(args.root, "train")):
    sys.exit("vs_image_peer: %s has no train/ folder; make one with scripts/make-image-folder %s" % (args.root, args.root))
if not os.access(args.example, os.X_OK):
    sys.exit("vs_image_peer: %s is not built (cmake --build build --target image_classifier)" % args.example)

env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
names = iter(range(1_000_000))


loads = []


def run(cmd):
    result = process_tree.measured(cmd, env, "vs_image_peer")
    loads.append(result["load"])
    return result


def peer(flags, loaders, mode="eager"):
    return run([args.python, args.peer, "--loader-workers", str(loaders)] + flags +
               (["--compile"] if mode == "compile" else []))


def dtrain(flags, loaders, precision="fp32"):
    # A run directory of its own per run (the example starts fresh, but keep runs apart).
    return run([args.example, "--loader-threads", str(loaders), "--precision", precision] + flags +
               ["--storage-path", args.storage_path, "--name", "bench_%d_%d" % (os.getpid(), next(names))])


def median(runs, key):
    return statistics.median(r[key] for r in runs)


common = ["--root", args.root, "--workers", str(args.workers), "--global-batch", str(args.global_batch),
          "--threads-per-worker", "1"]
report = {"workers": args.workers, "width": args.width, "global_batch": args.global_batch, "weights": args.weights,
          "peer": args.peer, "peer_mode": args.peer_mode, "decode": {}, "train": {}}
idle.wait(args.allow_load)

if not args.weights:
    print("input pipeline (--decode-only, %d batches of %d per worker, %d workers)" %
          (args.decode_steps, args.global_batch // args.workers, args.workers))
    print("%-15s %14s %14s %16s %16s %7s" % ("dtrain loaders", "peer img/s", "dtrain img/s", "peer /loader",
                                             "dtrain /loader", "ratio"))
flags = common + ["--decode-only", "--max-steps", str(args.decode_steps)]
for loaders in [] if args.weights else [int(x) for x in args.loader_threads.split(",")]:
    peers, ours = [], []
    for _ in range(args.repeats):
        peers.append(peer(flags, 0))
        ours.append(dtrain(flags, loaders))
    a, b = median(peers, "decode_samples_per_s"), median(ours, "decode_samples_per_s")
    pa, pb = a / args.workers, b / (args.workers * max(1, loaders))
    report["decode"][str(loaders)] = {"peer": a, "dtrain": b, "peer_per_loader": pa, "dtrain_per_loader": pb,
                                      "ratio": b / a, "per_loader_ratio": pb / pa}
    print("%-15d %14.1f %14.1f %16.1f %16.1f %6.2fx" % (loaders, a, b, pa, pb, pb / pa))

print("\ntraining (ResNet-18 width %d%s, %d steps of global batch %d, %d workers x 1 thread)" %
      (args.width, ", from " + args.weights if args.weights else "", args.train_steps, args.global_batch, args.workers))
flags = common + ["--width", str(args.width), "--max-steps", str(args.train_steps)]
flags += ["--weights", args.weights] if args.weights else []
modes = ["eager", "compile"] if args.peer_mode == "both" else [args.peer_mode]
peer_rows = {mode: "peer " + mode if len(modes) > 1 else "peer" for mode in modes}
runs = {row: [] for row in peer_rows.values()}
runs.update({"dtrain fp32": [], "dtrain bf16": []})
for _ in range(args.repeats):
    for mode, row in peer_rows.items():
        runs[row].append(peer(flags, 0, mode))
    runs["dtrain fp32"].append(dtrain(flags, 1, "fp32"))
    runs["dtrain bf16"].append(dtrain(flags, 1, "bf16"))
print("%-12s %12s %10s %10s %12s %8s" % ("", "samples/s", "startup_s", "test_acc", "peak MiB", "ratio"))
base = max(median(runs[row], "train_samples_per_s") for row in peer_rows.values())  # the faster mode
for name, rs in runs.items():
    sps = median(rs, "train_samples_per_s")
    row = {"train_samples_per_s": sps, "startup_s": median(rs, "startup_s"), "test_accuracy": median(rs, "test_accuracy"),
           "peak_rss_sum_mb": median(rs, "peak_rss_sum_mb"), "ratio": sps / base}
    report["train"][name] = row
    print("%-12s %12.1f %10.2f %10.4f %12.0f %7.2fx" % (name, sps, row["startup_s"], row["test_accuracy"],
                                                      row["peak_rss_sum_mb"], row["ratio"]))
report["load"] = idle.verdict(loads)
print(json.dumps(report, sort_keys=True))
idle.refuse(report["load"], args.allow_load)
