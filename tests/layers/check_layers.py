#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The include-layer test: every header under include/dtrain may include dtrain headers of its own
layer or below, never of a layer above; so may its bodies (impl/<header>.ipp, of its header's
layer). Fails naming each offending pair.

Usage: check_layers.py [INCLUDE_DIR]   (default: include/ beside this script's tests/ directory)
       check_layers.py --self-test     (the check catches an upward include and an unmapped header)
"""

import pathlib
import re
import sys
import tempfile

# Layers, bottom up. A header's layer is that of the longest entry matching its path under
# include/dtrain/: an entry ending in "/" is a folder (everything under it), any other a file.
# docs/design.md ("Layers") draws the same table: change both together.
LAYERS = [
    ("error/version", ["error.hpp", "version.hpp", "memory.hpp", "progress_mark.hpp"]),
    ("vocabulary", ["policy/category.hpp", "collective.hpp"]),
    ("configuration", ["config.hpp", "metrics.hpp", "run_directory.hpp"]),
    ("data and launch", ["data/", "data/image.hpp", "data/image_folder.hpp", "data/vit_image_processor.hpp", "sampler/", "launch/", "detail/"]),
    ("backends and checkpointers", ["backend/", "backend/detail/hierarchical.hpp", "checkpointer/", "weights.hpp", "weights/", "concept/backend.hpp", "concept/checkpointer.hpp",
                                    "concept/sampler.hpp", "concept/archetypes.hpp", "nn/lora_layer.hpp"]),
    ("strategies, precisions, evaluation", ["strategy/", "precision/", "evaluation/", "schedule/", "nn/",
                                            "concept/strategy.hpp", "concept/precision.hpp"]),
    ("tracking", ["tracking/", "tracker/", "result.hpp", "concept/tracker.hpp"]),
    ("context", ["context.hpp", "context/", "policy/concepts.hpp", "policy/resolve.hpp"]),
    ("trainer", ["trainer.hpp", "trainer/", "evaluation/batch_predict.hpp"]),
    ("tune", ["tune.hpp", "tune/"]),
    ("umbrellas", ["dtrain.hpp", "data.hpp", "models.hpp", "inference.hpp", "all.hpp"]),
]

INCLUDE = re.compile(r'^\s*#\s*include\s*<dtrain/([^>]+)>', re.MULTILINE)


def layer_of(path):
    """(layer index, matching entry) of a path relative to include/dtrain, or None. A header's
    bodies (X/impl/Y.ipp) are in its header's (X/Y.hpp) layer."""
    if path.endswith(".ipp"):
        path = str(pathlib.PurePosixPath(path).parent.parent / (pathlib.PurePosixPath(path).stem + ".hpp"))
        path = path[2:] if path.startswith("./") else path
    best = None
    for index, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            hit = path.startswith(entry) if entry.endswith("/") else path == entry
            if hit and (best is None or len(entry) > len(best[1])):
                best = (index, entry)
    return best


def describe(path, layer):
    return f"{path} (layer {layer} {LAYERS[layer][0]})"


def check(root):
    """Returns the list of problems found under root (include/dtrain)."""
    problems = []
    headers = sorted(p for p in root.rglob("*.hpp"))
    if not headers:
        return [f"no headers under {root}: pass the include directory"]
    for header in headers + sorted(root.rglob("impl/*.ipp")):
        rel = header.relative_to(root).as_posix()
        own = layer_of(rel)
        if own is None:
            problems.append(f"{rel} is in no layer: add it to LAYERS in {pathlib.Path(__file__).name}")
            continue
        for target in INCLUDE.findall(header.read_text(encoding="utf-8")):
            theirs = layer_of(target)
            if theirs is None:
                problems.append(f"{rel} includes <dtrain/{target}>, which is in no layer: add it to LAYERS")
            elif theirs[0] > own[0]:
                problems.append(f"{describe(rel, own[0])} includes <dtrain/{target}> from a higher layer: "
                                f"{describe(target, theirs[0])}")
    return problems


def self_test():
    """The check must fail on a tree that breaks the layering, naming both headers."""
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp) / "dtrain"
        (root / "strategy").mkdir(parents=True)
        (root / "error.hpp").write_text("#pragma once\n#include <dtrain/version.hpp>\n")
        (root / "version.hpp").write_text("#pragma once\n")
        (root / "context.hpp").write_text("#pragma once\n#include <dtrain/error.hpp>\n")
        (root / "strategy" / "x.hpp").write_text("#pragma once\n#  include <dtrain/context.hpp>\n")
        (root / "stray.hpp").write_text("#pragma once\n")
        problems = check(root)
        upward = [p for p in problems if p.startswith("strategy/x.hpp") and "<dtrain/context.hpp>" in p]
        stray = [p for p in problems if p.startswith("stray.hpp is in no layer")]
        if len(problems) != 2 or not upward or not stray:
            print("self-test: expected exactly an upward include (strategy/x.hpp -> context.hpp) and an "
                  f"unmapped header (stray.hpp); found {problems}", file=sys.stderr)
            return 1
        print("self-test: the check reports an upward include and an unmapped header")
        return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    here = pathlib.Path(__file__).resolve().parent
    include = pathlib.Path(argv[1]) if len(argv) > 1 else here.parent.parent / "include"
    problems = check(include / "dtrain")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{len(problems)} include(s) break the layering (bottom up: "
              + " < ".join(name for name, _ in LAYERS) + ")", file=sys.stderr)
        return 1
    print(f"every include under {include / 'dtrain'} respects the {len(LAYERS)} layers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
