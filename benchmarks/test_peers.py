# SPDX-License-Identifier: Apache-2.0
"""The Python peers of benchmarks/peers/ train two steps each on tiny data made here, and print the
JSON line the side-by-side scripts (vs_peer.py, vs_text_peer.py, vs_image_peer.py) read: its keys
present, a finite loss, the steps asked for, "mode": "eager"; the Fashion-MNIST peer under torchrun
too (2 processes, one line from rank 0; --workers other than torchrun's is refused). A missing data
directory is refused in one line, without a traceback.

    tests/tools/venv-python benchmarks/test_peers.py

Prints "ok: ..." and exits 0, or prints "FAIL ..." for each failed check and exits 1.
"""
import csv
import gzip
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

from PIL import Image

here = os.path.dirname(os.path.abspath(__file__))
python = os.path.join(here, "..", "tests", "tools", "venv-python")
failures = []

TIMING = ["steps", "train_samples", "train_loop_s", "train_samples_per_s", "startup_s", "wall_s", "mode", "torch"]
KEYS = {
    "fashion_mnist.py": TIMING + ["final_train_loss", "mean_train_loss_last50", "test_accuracy", "eval_s",
                                  "model", "workers", "global_batch", "per_worker_batch"],
    "text.py": TIMING + ["final_train_loss", "pipeline_s", "val_loss", "val_accuracy", "test_accuracy", "test_f1_macro",
                         "majority_baseline", "vocab_size", "classes", "train_rows"],
    "images.py": TIMING + ["final_train_loss", "test_accuracy", "classes", "width", "loader_workers"],
}


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL " + what, flush=True)


def idx(path, magic_dims, data):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">HBB", 0, 8, len(magic_dims)) + struct.pack(">%dI" % len(magic_dims), *magic_dims))
        f.write(bytes(data))


def make_data(root, rng):
    """Fashion-MNIST IDX files (64 train, 16 test), a text corpus of two tags, an image folder of two classes."""
    mnist = os.path.join(root, "mnist")
    os.makedirs(mnist)
    for prefix, n in (("train", 64), ("t10k", 16)):
        idx(os.path.join(mnist, prefix + "-images-idx3-ubyte.gz"), (n, 28, 28), [rng.randrange(256) for _ in range(n * 784)])
        idx(os.path.join(mnist, prefix + "-labels-idx1-ubyte.gz"), (n,), [rng.randrange(10) for _ in range(n)])

    text = os.path.join(root, "text")
    os.makedirs(text)
    words = {"games": ["chess", "puzzle", "arcade", "board"], "net": ["http", "proxy", "socket", "mail"]}
    for name, n in (("dataset.csv", 40), ("holdout.csv", 8)):
        with open(os.path.join(text, name), "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["id", "title", "description", "tag"])
            for i in range(n):
                tag = "games" if i % 2 else "net"
                out.writerow([i, "pkg%d" % i, " ".join(rng.choice(words[tag]) for _ in range(6)), tag])

    images = os.path.join(root, "images")
    for split, n in (("train", 8), ("test", 4)):
        for label in ("0-dark", "1-light"):
            folder = os.path.join(images, split, label)
            os.makedirs(folder)
            for i in range(n):
                shade = rng.randrange(0, 100) if label == "0-dark" else rng.randrange(150, 256)
                Image.new("L", (28, 28), shade).save(os.path.join(folder, "%d.png" % i))
    return mnist, text, images


def run_peer(script, flags, launcher=()):
    cmd = list(launcher) + [python, os.path.join(here, "peers", script)] + flags
    t0 = time.time()
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    took = time.time() - t0
    if out.returncode != 0:
        check(False, "%s exits 0 (%d): %s\n%s" % (script, out.returncode, " ".join(cmd), out.stderr[-3000:]))
        return
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    check(len(lines) == 1, "%s prints one JSON line: %r" % (script, out.stdout[-500:]))
    if not lines:
        return
    result = json.loads(lines[-1])
    missing = [k for k in KEYS[script] if k not in result]
    check(not missing, "%s's JSON line has %s" % (script, ", ".join(missing)))
    loss = result.get("final_train_loss")
    check(isinstance(loss, float) and math.isfinite(loss), "%s's final_train_loss is finite: %r" % (script, loss))
    check(result.get("steps") == 2 and result.get("mode") == "eager",
          "%s trained 2 steps in eager mode: %r" % (script, result))
    print("%s: %.1f s, %s" % (script, took, lines[-1]), flush=True)


with tempfile.TemporaryDirectory() as tmp:
    mnist, text, images = make_data(tmp, random.Random(0))
    small = ["--max-steps", "2", "--global-batch", "8"]
    run_peer("fashion_mnist.py", ["--data-dir", mnist, "--model", "mlp", "--workers", "2"] + small)
    # Under torchrun, each process is one worker of torchrun's group; rank 0 alone prints the line.
    torchrun = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--no_python"]
    run_peer("fashion_mnist.py", ["--data-dir", mnist, "--model", "mlp", "--workers", "2"] + small, torchrun)
    out = subprocess.run(torchrun + [python, os.path.join(here, "peers", "fashion_mnist.py"), "--data-dir", mnist,
                                     "--workers", "3", "--max-steps", "2", "--global-batch", "6"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    check(out.returncode != 0 and "--workers 3, but the launcher started 2 workers" in out.stderr,
          "--workers other than torchrun's WORLD_SIZE is refused: exit %d, %r" % (out.returncode, out.stderr[-800:]))
    run_peer("text.py", ["--data", text, "--workers", "1", "--vocab", "50"] + small)
    run_peer("images.py", ["--root", images, "--workers", "1", "--width", "4"] + small)

    missing = os.path.join(tmp, "no-such-dir")
    out = subprocess.run([python, os.path.join(here, "peers", "text.py"), "--data", missing],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    check(out.returncode != 0 and "no-such-dir" in out.stderr and "Traceback" not in out.stderr,
          "a missing --data is refused in one line: exit %d, %r" % (out.returncode, out.stderr[-500:]))

if failures:
    sys.exit(1)
print("ok: the three peers train and print their JSON line, under torchrun too; a missing data directory is refused plainly")
