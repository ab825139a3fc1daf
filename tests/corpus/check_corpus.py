#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Runs scripts/make-text-corpus on a small slice (--per-tag) and checks what a reader relies on:
the columns, the tags, the seeded 10% holdout, ids unique across the two files, rows in package-name
order, real descriptions, the same files from the same seed and other files from another seed, and
clear errors for bad arguments.

    check_corpus.py SCRIPT WORK_DIR
"""
import csv
import json
import os
import shutil
import subprocess
import sys

script, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
lists = os.path.join(work, "lists")
failed = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failed.append(what)


def make(out, *extra):
    return subprocess.run([script, os.path.join(work, out), "--lists", lists, *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rows(out, name):
    with open(os.path.join(work, out, name), newline="", encoding="utf-8") as f:
        r = csv.DictReader(f)
        return r.fieldnames, list(r)


r = make("a", "--per-tag", "40", "--seed", "3")
print(r.stdout, r.stderr)
check(r.returncode == 0, "make-text-corpus --per-tag 40 exits 0")
fields, data = rows("a", "dataset.csv")
_, hold = rows("a", "holdout.csv")
tags = {"admin", "games", "net", "science", "utils"}
check(fields == ["id", "title", "description", "tag"], "columns id,title,description,tag: %s" % fields)
check(len(data) + len(hold) == 200, "5 tags x 40 rows: %d + %d" % (len(data), len(hold)))
check(len(hold) == 20, "holdout is 10%%: %d rows" % len(hold))
check({x["tag"] for x in data + hold} == tags, "the five sections, without area prefixes")
ids = [int(x["id"]) for x in data + hold]
check(sorted(ids) == list(range(200)), "ids 0..199, each in exactly one file")
titles = [x["title"] for x in sorted(data + hold, key=lambda x: int(x["id"]))]
check(titles == sorted(titles), "ids follow package-name order")
check(all(len(x["description"].split()) >= 3 for x in data + hold), "every description has words")
info = json.load(open(os.path.join(work, "a", "corpus.json")))
check(info["rows"] == 200 and info["seed"] == 3 and info["rows_with_long_description"] > 150,
      "corpus.json: rows, seed, long descriptions (%d)" % info["rows_with_long_description"])

r = make("b", "--per-tag", "40", "--seed", "3")
same = all(open(os.path.join(work, "a", f), "rb").read() == open(os.path.join(work, "b", f), "rb").read()
           for f in ("dataset.csv", "holdout.csv"))
check(r.returncode == 0 and same, "the same seed gives byte-identical files")
r = make("c", "--per-tag", "40", "--seed", "4")
_, hold4 = rows("c", "holdout.csv")
check({x["id"] for x in hold4} != {x["id"] for x in hold}, "another seed holds out other rows")

for args, message in [(["--sections", "admin"], "at least two distinct sections"),
                      (["--sections", "admin,nosuchsection"], "nosuchsection"),
                      (["--per-tag", "-1"], "--per-tag must be >= 0")]:
    r = make("bad", *args)
    check(r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr,
          "%s: a clear error naming %r: %s" % (" ".join(args), message, r.stderr.strip()))
sys.exit(1 if failed else 0)
