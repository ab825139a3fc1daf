#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails unless every ```cpp block of the given Markdown files is compiled by the test suite.

    check_docs.py --docs README.md docs/*.md --sources FILE... [--root DIR]

A block is compiled when its lines appear, in order and contiguous, in one of the --sources files
(the files CMake builds), each line prefixed with the same indentation (so a block may sit inside a
function), ignoring the block's leading and trailing blank lines. Every fenced block must carry a
language tag, so that a C++ block cannot escape the check untagged; only cpp blocks are compared.
And every marked region of the sources (a line `// [name]` opens it, the next `// [name]` closes
it) must be shown by some doc: a region that no doc shows any more is stale.
Each failure names the doc, the block's line, and the closest source lines.
"""
import argparse
import pathlib
import re
import sys

FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([^\s`]*)[^`]*$")  # the tag, then any info string
MARK = re.compile(r"^\s*// \[([^\]]+)\]\s*$")


def blocks(path):
    """(line number of the opening fence, language tag, lines) of every fenced block in `path`."""
    lines = path.read_text(encoding="utf-8").split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, tag = m.groups()
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence[0] * len(fence)) and lines[j].strip().strip(fence[0]) == ""):
            j += 1
        if j == len(lines):
            raise SystemExit(f"{path}:{i + 1}: this code block is never closed")
        body = [l[len(indent):] if l.startswith(indent) else l for l in lines[i + 1:j]]
        out.append((i + 1, tag, body))
        i = j + 1
    return out


def trim(lines):
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def match_at(src, at, block):
    """How many of the block's lines match src from line `at` under one common indentation."""
    first = src[at]
    if not first.endswith(block[0]) or first[: len(first) - len(block[0])].strip():
        return 0
    indent = first[: len(first) - len(block[0])]
    n = 0
    for k, line in enumerate(block):
        if at + k >= len(src):
            break
        got = src[at + k]
        if (line.strip() == "" and got.strip() == "") or got == indent + line:
            n += 1
        else:
            break
    return n


def regions(path, src):
    """(name, index of its first non-blank line, its length without outer blank lines) of every
    marked region of a source."""
    out, open_at = [], {}
    for i, line in enumerate(src):
        m = MARK.match(line)
        if not m:
            continue
        name = m.group(1)
        if name in open_at:
            start = open_at.pop(name) + 1
            while start < i and not src[start].strip():
                start += 1
            out.append((name, start, len(trim(src[start:i]))))
        else:
            open_at[name] = i
    for name, start in open_at.items():
        raise SystemExit(f"{path}:{start + 1}: region [{name}] is opened but never closed")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", nargs="+", required=True)
    ap.add_argument("--sources", nargs="+", required=True)
    ap.add_argument("--root", default=".", help="paths in messages are relative to this")
    a = ap.parse_args()
    root = pathlib.Path(a.root).resolve()

    def rel(p):
        try:
            return str(pathlib.Path(p).resolve().relative_to(root))
        except ValueError:
            return str(p)

    sources = {rel(s): pathlib.Path(s).read_text(encoding="utf-8").split("\n") for s in a.sources}
    failures, checked, shown = [], 0, []
    for doc in a.docs:
        for line_no, tag, body in blocks(pathlib.Path(doc)):
            where = f"{rel(doc)}:{line_no}"
            if not tag:
                failures.append(f"{where}: a code block without a language tag; tag it (```cpp blocks are "
                                "compiled and checked; ```text, ```sh, ```json ... are not)")
                continue
            if tag not in ("cpp", "c++"):
                continue
            block = trim(body)
            if not block:
                continue
            checked += 1
            best = (0, None, 0)
            for name, src in sources.items():
                for at in range(len(src)):
                    n = match_at(src, at, block)
                    if n == len(block):
                        shown.append((name, at, len(block)))
                        break
                    if n > best[0]:
                        best = (n, name, at)
                else:
                    continue
                break
            else:
                n, name, at = best
                hint = (f"; the closest is {name}:{at + 1}, whose line {at + n + 1} reads\n      "
                        f"{sources[name][at + n]!r}\n    where the block's line {line_no + 1 + n} reads\n      "
                        f"{block[n]!r}" if name else "")
                failures.append(f"{where}: this ```cpp block is not in any compiled source "
                                f"({', '.join(sources)}){hint}\n    Edit the block and the source together: "
                                "the source is what the test suite builds and runs.")
    # Regions no doc shows any more.
    for name, src in sources.items():
        for region, start, length in regions(name, src):
            if (name, start, length) not in shown:
                failures.append(f"{name}:{start + 1}: region [{region}] is shown by no ```cpp block of "
                                f"{', '.join(rel(d) for d in a.docs)}; update the doc's block or delete the region")
    if failures:
        print("\n".join(failures))
        print(f"check_docs: {len(failures)} problem(s)")
        return 1
    print(f"check_docs: all {checked} ```cpp blocks of {len(a.docs)} docs are compiled sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
