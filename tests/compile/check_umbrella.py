#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The umbrella tests.

    check_umbrella.py INCLUDE_DIR

1. <dtrain/all.hpp> brings every public header that needs no optional library: follows the
   `#include <dtrain/...>` lines and fails naming each public header (not under a detail/ folder)
   that it never reaches, except those that need an optional library and are included by name
   (OPTIONAL). Issue 30: docs/data.md's code did not compile with the umbrella alone.
2. <dtrain/dtrain.hpp>, a training program's umbrella, does not bring the other areas (issue 48: a
   user who trains a CNN does not parse BERT, ViT, WordPiece, Tune or the report): with
   DTRAIN_SEPARATE_COMPILATION (the impl/*.ipp files not followed) it reaches none of NOT_TRAINING.
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*<(dtrain/[^>]+)>', re.MULTILINE)
# The bodies' include in each header, which only the header-only mode follows.
BODIES = re.compile(r'#ifndef DTRAIN_SEPARATE_COMPILATION\n#include <[^>]+>\n#endif')
# Headers that need a library dtrain does not require, with what they need.
OPTIONAL = {
    "dtrain/data/image.hpp": "OpenCV (the dtrain::images target)",
    "dtrain/data/image_folder.hpp": "OpenCV (the dtrain::images target)",
    "dtrain/data/image_transforms.hpp": "OpenCV (the dtrain::images target)",
    "dtrain/evaluation/image_inputs.hpp": "OpenCV (the dtrain::images target)",
    "dtrain/data/vit_image_processor.hpp": "OpenCV (the dtrain::images target)",
    "dtrain/data/clip_image_processor.hpp": "OpenCV (the dtrain::images target)",
    "dtrain/data/hub_image_processor.hpp": "OpenCV (the dtrain::images target)",
}
# What a training program's umbrella must not parse in the compiled mode.
NOT_TRAINING = re.compile(r'^dtrain/(nn/|tune|weights|data/(wordpiece|bpe_tokenizer|sentencepiece|csv|jsonl|pipeline|preprocess)|'
                          r'tracking/(report|html)\.hpp|evaluation/(predictor|batch_predict))')


def reached_from(root, start, follow_bodies):
    reached, todo = set(), [start]
    while todo:
        header = todo.pop()
        if header in reached or not (root / header).exists():
            continue
        reached.add(header)
        text = (root / header).read_text(encoding="utf-8")
        if not follow_bodies:
            text = BODIES.sub("", text)
        todo += INCLUDE.findall(text)
    return reached


def main():
    root = pathlib.Path(sys.argv[1]).resolve()
    reached = reached_from(root, "dtrain/all.hpp", follow_bodies=True)
    public = sorted(str(p.relative_to(root)) for p in (root / "dtrain").rglob("*.hpp") if "detail" not in p.parts)
    missing = [h for h in public if h not in reached and h not in OPTIONAL]
    wrongly = [h for h in OPTIONAL if h in reached]
    for h in missing:
        print(f"<{h}> is not reached from <dtrain/all.hpp>: include it in its area's umbrella, or list it in "
              f"OPTIONAL in {pathlib.Path(__file__).name} with the library it needs")
    for h in wrongly:
        print(f"<{h}> needs {OPTIONAL[h]} but <dtrain/all.hpp> includes it: a program without that library "
              "would not compile")
    training = sorted(h for h in reached_from(root, "dtrain/dtrain.hpp", follow_bodies=False) if NOT_TRAINING.match(h))
    for h in training:
        print(f"<dtrain/dtrain.hpp> reaches <{h}> in the compiled mode: a training program would parse it; "
              "include it from the header that needs it in its impl/*.ipp, or from its area's umbrella")
    if missing or wrongly or training:
        return 1
    print(f"<dtrain/all.hpp> reaches all {len(public) - len(OPTIONAL)} public headers that need no optional "
          f"library ({', '.join(sorted(OPTIONAL))} are included by name); <dtrain/dtrain.hpp> reaches none of "
          "the other areas' headers in the compiled mode")
    return 0


if __name__ == "__main__":
    sys.exit(main())
