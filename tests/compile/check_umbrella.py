#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The umbrella test: <dtrain/dtrain.hpp> brings every public header that needs no optional library.

    check_umbrella.py INCLUDE_DIR

Follows the `#include <dtrain/...>` lines from dtrain/dtrain.hpp and fails naming each public
header (not under a detail/ folder) that it never reaches, except those that need an optional
library and are included by name (OPTIONAL). Issue 30: docs/data.md's code did not compile with the
umbrella alone ('read_csv' is not a member of 'data').
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*<(dtrain/[^>]+)>', re.MULTILINE)
# Headers that need a library dtrain does not require, with what they need.
OPTIONAL = {
    "dtrain/data/image.hpp": "OpenCV (the dtrain::images target)",
    "dtrain/data/image_folder.hpp": "OpenCV (the dtrain::images target)",
    "dtrain/data/image_transforms.hpp": "OpenCV (the dtrain::images target)",
    "dtrain/evaluation/image_inputs.hpp": "OpenCV (the dtrain::images target)",
    "dtrain/data/vit_image_processor.hpp": "OpenCV (the dtrain::images target)",
}


def main():
    root = pathlib.Path(sys.argv[1]).resolve()
    reached, todo = set(), ["dtrain/dtrain.hpp"]
    while todo:
        header = todo.pop()
        if header in reached or not (root / header).exists():
            continue
        reached.add(header)
        todo += INCLUDE.findall((root / header).read_text(encoding="utf-8"))
    public = sorted(str(p.relative_to(root)) for p in (root / "dtrain").rglob("*.hpp") if "detail" not in p.parts)
    missing = [h for h in public if h not in reached and h not in OPTIONAL]
    wrongly = [h for h in OPTIONAL if h in reached]
    for h in missing:
        print(f"<{h}> is not reached from <dtrain/dtrain.hpp>: include it there, or list it in OPTIONAL in "
              f"{pathlib.Path(__file__).name} with the library it needs")
    for h in wrongly:
        print(f"<{h}> needs {OPTIONAL[h]} but <dtrain/dtrain.hpp> includes it: a program without that library "
              "would not compile")
    if missing or wrongly:
        return 1
    print(f"<dtrain/dtrain.hpp> reaches all {len(public) - len(OPTIONAL)} public headers that need no optional "
          f"library ({', '.join(sorted(OPTIONAL))} are included by name)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
