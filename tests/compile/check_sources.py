#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The two compilation modes share one body per function (docs/packaging.md):

    check_sources.py SOURCE_DIR

- each include/dtrain/**/impl/X.ipp belongs to the header X.hpp beside its impl/ folder, which
  includes it last, under `#ifndef DTRAIN_SEPARATE_COMPILATION` (header-only: the bodies inline);
- src/*.cpp, dtrain's library under DTRAIN_SEPARATE_COMPILATION, include every .ipp exactly once,
  and nothing else (a body left out is an undefined symbol in the compiled mode; one included
  twice, a duplicate);
- a function an .ipp defines outside a class template is marked DTRAIN_INLINE (inline when
  header-only, compiled once otherwise): a plain definition would be defined again in every program
  that includes the header-only library.
"""
import pathlib
import re
import sys


def main():
    root = pathlib.Path(sys.argv[1]).resolve()
    include = root / "include"
    errors = []
    ipps = sorted(p.relative_to(include).as_posix() for p in include.rglob("impl/*.ipp"))
    for ipp in ipps:
        header = pathlib.PurePosixPath(ipp).parent.parent / (pathlib.PurePosixPath(ipp).stem + ".hpp")
        path = include / header
        if not path.exists():
            errors.append(f"<{ipp}> has no header {header} beside its impl/ folder")
            continue
        tail = path.read_text(encoding="utf-8").rstrip().splitlines()[-3:]
        if tail != ["#ifndef DTRAIN_SEPARATE_COMPILATION", f"#include <{ipp}>", "#endif"]:
            errors.append(f"<{header}> does not end by including <{ipp}> under #ifndef DTRAIN_SEPARATE_COMPILATION")
    included = {}
    for src in sorted((root / "src").glob("*.cpp")):
        for line in src.read_text(encoding="utf-8").splitlines():
            if m := re.match(r"\s*#\s*include\s*<([^>]+)>", line):
                if not m.group(1).endswith(".ipp"):
                    errors.append(f"src/{src.name} includes <{m.group(1)}>: src/*.cpp include impl/*.ipp files only")
                included.setdefault(m.group(1), []).append(src.name)
    for ipp in ipps:
        where = included.get(ipp, [])
        if len(where) != 1:
            errors.append(f"<{ipp}> is included by {len(where)} of src/*.cpp ({', '.join(where) or 'none'}); "
                          "it must be included by exactly one")
    for ipp in included:
        if ipp not in ipps:
            errors.append(f"src/ includes <{ipp}>, which does not exist")
    # Definitions at namespace scope that return something and open a body, without DTRAIN_INLINE,
    # inline or template: `Type name(...) {` or `Type Class::name(...) {` at the start of a line.
    plain = re.compile(r"^(?!DTRAIN_INLINE|inline|template|static|constexpr|namespace|struct|class|enum|using|"
                       r"typedef|DTRAIN_|#|//|\s|\}|[A-Za-z_:<>]+\s*=)([A-Za-z_][\w:<>,\s\*&]*?)\b[\w:~]+\([^;]*$")
    for ipp in ipps:
        lines = (include / ipp).read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if plain.match(line) and line.rstrip().endswith(("{", ",", "(")) and not lines[number - 2].startswith("template"):
                errors.append(f"{ipp}:{number}: a definition without DTRAIN_INLINE: {line.strip()}")
    for e in errors:
        print(e)
    if errors:
        return 1
    print(f"{len(ipps)} impl/*.ipp files, each included by its header (header-only) and by one of src/*.cpp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
