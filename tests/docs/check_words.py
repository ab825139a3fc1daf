#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails on words in the docs that a user cannot follow, and on links that lead nowhere.

    check_words.py --root DIR     (README.md, CHANGELOG.md, docs/*.md, and the comments of
                                   include/ and examples/ under DIR)
    check_words.py --self-test    (each rule fails on a bad sample, and passes a good one)

Rules, each failure named file:line with what to write instead:
  issue-number  "issue 27", "Issue #5", "issues 51 and 52": a tracker's number tells a reader
                nothing; say what the feature or the fix is.
  outside-path  a path that leaves the repository for the developers' own files: `../shared/...`,
                or a `../` path to a source file (.py, .sh, .md, .hpp, .cpp, ...) that exists
                neither from the file's folder nor from the repository's root; or a developer's
                machine (`/work/...`, `/home/...`). Not flagged: system paths a user has
                (`/usr/share/datasets/...`, `/proc/...`), scratch folders a command makes
                (`/tmp/corpus`), and `../` paths to folders or build outputs relative to some other
                folder (`../mlruns/` beside a run directory, `../dtrain-dev_0.1.0_all.deb` written by
                dpkg-buildpackage, a vcpkg overlay's `../../ports`).
  link          a relative Markdown link to a file that does not exist, or to a `#heading` that the
                target has no heading for (GitHub's anchors: lower case, spaces to '-', punctuation
                other than '-' and '_' dropped, a repeated heading gets -1, -2, ...).
  unit          "step-seconds" or "test-seconds", unless the file defines the term: emphasised
                (`*step-seconds*`) where it is first used, followed by what it counts.
Markdown is checked in prose and code blocks alike (a command in a block is read too), except that
links are read only outside code. In include/ and examples/ only comments are read.
Python 3's standard library only.
"""
import argparse
import pathlib
import re
import sys
import tempfile

ISSUE = re.compile(r"\b[Ii]ssues?\s*#?\s?\d+")
UP_PATH = re.compile(r"(?<![\w./~-])((?:\.\./)+[\w.-]+(?:/[\w.-]+)*)")
HOME_PATH = re.compile(r"(?<![\w.~-])(/(?:work|home|scratch|Users)/[\w.-]+(?:/[\w.-]*)*)")
SOURCE_FILE = re.compile(r"\.(py|sh|md|hpp|cpp|h|txt|json|toml)$")
UNIT = re.compile(r"\b(step|test)-seconds\b")
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # a link's text may end on an earlier line
REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```+|~~~+)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")

FIX = {
    "issue-number": "say what the feature or the fix is in a user's words; the tracker's number "
                    "means nothing to a reader",
    "outside-path": "name a file of the repository, or describe the thing (a script that is not "
                    "shipped is not a path a user has)",
    "unit": "say what is counted (for example 'seconds of build steps, summed over the steps "
            "ninja ran') or define the term where it is first used: *step-seconds* (...)",
}


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = re.sub(r"<[^>]+>", "", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    """Every anchor a Markdown file offers (its headings', numbered as GitHub numbers repeats)."""
    if path not in cache:
        seen, out, in_code = {}, set(), None
        for line in path.read_text(encoding="utf-8").split("\n"):
            f = FENCE.match(line)
            if f:
                in_code = None if in_code and f.group(1)[0] == in_code else (in_code or f.group(1)[0])
                continue
            if in_code:
                continue
            out.update(HTML_ANCHOR.findall(line))
            m = HEADING.match(line)
            if not m:
                continue
            s = slug(m.group(2))
            n = seen.get(s, 0)
            out.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
        cache[path] = out
    return cache[path]


def markdown_lines(path):
    """(line number, text, in a code block) of a Markdown file."""
    in_code = None
    for i, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        f = FENCE.match(line)
        if f:
            ch = f.group(1)[0]
            if in_code is None:
                in_code = ch
            elif ch == in_code:
                in_code = None
            yield i, line, True
            continue
        yield i, line, in_code is not None


def comment_lines(path):
    """(line number, comment text) of a C++ or CMake file: only what a comment says."""
    cmake = path.name == "CMakeLists.txt" or path.suffix == ".cmake"
    in_block = False
    for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), 1):
        if cmake:
            at = line.find("#")
            if at >= 0:
                yield i, line[at + 1:]
            continue
        text = ""
        rest = line
        while rest:
            if in_block:
                end = rest.find("*/")
                if end < 0:
                    text += rest
                    rest = ""
                else:
                    text += rest[:end]
                    rest = rest[end + 2:]
                    in_block = False
                continue
            m = re.search(r"(?<!:)//|/\*", rest)
            if not m:
                break
            if m.group(0) == "//":
                text += rest[m.end():]
                break
            in_block = True
            rest = rest[m.end():]
        if text:
            yield i, text


def word_problems(root, path, n, text):
    rel = path.relative_to(root)
    out = []
    for m in ISSUE.finditer(text):
        out.append(f"{rel}:{n}: issue-number: \"{m.group(0)}\": {FIX['issue-number']}")
    for m in UP_PATH.finditer(text):
        up = m.group(1).rstrip(".")
        first = up.lstrip("./").split("/")[0]
        if first == "shared" or (SOURCE_FILE.search(up) and not any(
                (base / up).resolve().exists() and root in (base / up).resolve().parents
                for base in (path.parent, root))):
            out.append(f"{rel}:{n}: outside-path: \"{up}\" (not in the repository): {FIX['outside-path']}")
    for m in HOME_PATH.finditer(text):
        out.append(f"{rel}:{n}: outside-path: \"{m.group(1)}\" (a developer's machine): {FIX['outside-path']}")
    return out


def check_markdown(root, path):
    problems = []
    text = path.read_text(encoding="utf-8")
    defined = {u for u in ("step", "test") if re.search(rf"(\*\*?|_){u}-seconds(\*\*?|_)", text)}
    for n, line, in_code in markdown_lines(path):
        problems += word_problems(root, path, n, line)
        for m in UNIT.finditer(line):
            if m.group(1) not in defined:
                problems.append(f"{path.relative_to(root)}:{n}: unit: \"{m.group(0)}\" is never defined "
                                f"in {path.name}: {FIX['unit']}")
        if in_code:
            continue
        prose = INLINE_CODE.sub(lambda c: " " * len(c.group(0)), line)
        targets = LINK.findall(prose)
        r = REF_LINK.match(prose)
        if r:
            targets.append(r.group(1))
        for target in targets:
            problems += link_problems(root, path, n, target)
    return problems


def link_problems(root, path, n, target):
    rel = path.relative_to(root)
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
        return []  # http:, https:, mailto:
    file_part, _, anchor = target.partition("#")
    dest = (path.parent / file_part).resolve() if file_part else path
    if not (dest == root or root in dest.parents):
        return [f"{rel}:{n}: link: \"{target}\" leaves the repository: link a file of the repository"]
    if not dest.exists():
        return [f"{rel}:{n}: link: \"{target}\": no file {dest.relative_to(root)}: link a file that exists"]
    if anchor and dest.suffix == ".md":
        have = anchors(dest)
        if anchor not in have:
            close = sorted(have, key=lambda a: -len(set(a.split("-")) & set(anchor.split("-"))))[:2]
            hint = " or ".join(f"#{c}" for c in close) if close else "a heading that exists"
            return [f"{rel}:{n}: link: \"{target}\": {dest.relative_to(root)} has no heading with the anchor "
                    f"#{anchor}: write {hint}"]
    return []


def check_source(root, path):
    problems = []
    for n, text in comment_lines(path):
        problems += word_problems(root, path, n, text)
        for m in UNIT.finditer(text):
            problems.append(f"{path.relative_to(root)}:{n}: unit: \"{m.group(0)}\": {FIX['unit']}")
    return problems


def files(root):
    md = [root / "README.md", root / "CHANGELOG.md"] + sorted((root / "docs").glob("*.md"))
    src = []
    for folder in ("include", "examples"):
        for p in sorted((root / folder).rglob("*")):
            if p.is_file() and (p.suffix in (".hpp", ".cpp", ".h", ".cmake") or p.name == "CMakeLists.txt"):
                src.append(p)
    return [p for p in md if p.exists()], src


def check(root):
    root = root.resolve()
    md, src = files(root)
    problems = []
    for p in md:
        problems += check_markdown(root, p)
    for p in src:
        problems += check_source(root, p)
    return problems, len(md) + len(src)


SAMPLES = {
    "README.md": "# Title\n\nSee [the guide](docs/guide.md#a-heading) and [this](#title).\n",
    "docs/guide.md": "# Guide\n\n## A heading\n\n## `ctx.step()`: one step\n\n## A heading\n\n"
                     "Links: [ok](#a-heading-1), [ok](#ctxstep-one-step), [ok](../README.md#title).\n",
    "include/dtrain/x.hpp": "#pragma once\n// What x does.\nint x = 1;  // returns 1\n",
    "CHANGELOG.md": "# Changes\n\n- A *step-seconds* (seconds of build steps, summed) figure: 10 step-seconds.\n",
}
BAD = {
    "issue-number": ("docs/guide.md", "\nAs issue 27 asked, and Issue #5, and issues 51 and 52.\n", 3),
    "outside-path": ("docs/guide.md", "\nRun `../shared/peers/text_peer.py` from /work/wt/pkg.\n", 2),
    "link": ("docs/guide.md", "\n[a](missing.md), [b](#no-such-heading), [c](../README.md#nowhere), [a link\n"
                      "over two lines](#a-heading-2).\n", 4),
    "unit": ("docs/guide.md", "\nIt took 12 test-seconds.\n", 1),
    "comment": ("include/dtrain/x.hpp", "// the stall of issue 15, after ../shared/x.py\nint y = 2;\n", 2),
}


def self_test():
    def tree(extra=None):
        tmp = tempfile.TemporaryDirectory()
        root = pathlib.Path(tmp.name)
        for name, text in SAMPLES.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text + (extra[1] if extra and extra[0] == name else ""))
        return tmp, root

    tmp, root = tree()
    with tmp:
        good, _ = check(root)
    if good:
        print(f"self-test: the good sample should pass, found {good}", file=sys.stderr)
        return 1
    failed = 0
    for rule, (name, text, count) in BAD.items():
        tmp, root = tree((name, text))
        with tmp:
            anchors.__defaults__[0].clear()
            found, _ = check(root)
        tag = rule if rule != "comment" else ""
        hits = [p for p in found if p.startswith(name + ":") and f": {tag}" in p]
        if len(found) != count or len(hits) != count:
            print(f"self-test: {rule}: expected {count} failure(s) in {name}, found {found}", file=sys.stderr)
            failed += 1
        else:
            print(f"self-test: {rule}: {count} failure(s), e.g. {found[0]}")
    return 1 if failed else 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[2])
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args(argv[1:])
    if args.self_test:
        return self_test()
    problems, checked = check(args.root)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        counts = {}
        for p in problems:
            rule = p.split(": ", 2)[1]
            counts[rule] = counts.get(rule, 0) + 1
        print(f"{len(problems)} problem(s) in the docs and comments: "
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
        return 1
    print(f"{checked} files: no issue numbers, no paths outside the repository, no broken links, "
          "no undefined units")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
