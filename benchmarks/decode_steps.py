#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A decode step's time against the cached length (issue 51): dtrain's nn::KVCache beside
transformers' DynamicCache on the same Llama sizes (4 layers, width 256, 8 heads over 4 kv heads,
vocabulary 4096, seeded random weights), one thread each, batch 1.

    tests/tools/venv-python benchmarks/decode_steps.py [--bench build/benchmarks/decode_steps]
        [--lengths 32,128,512,1024] [--steps 32]

Build the C++ side first: cmake --build build --target decode_steps. For each length L both sides
compute an L-token prompt once, then time `steps` one-token steps (median); dtrain also times one
step without a cache (the L + 1 tokens again), the cost the cache saves. Flat means the step at the
longest length costs little more than at the shortest. Each side runs in its own process; load is
measured around each (benchmarks/idle.py) and loaded figures are refused.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import idle
import timed_build

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--bench", type=timed_build.program,
               default=os.path.join(here, "..", "build", "benchmarks", "decode_steps"))
p.add_argument("--lengths", default="32,128,512,1024")
p.add_argument("--steps", type=int, default=32)
p.add_argument("--hf-child", action="store_true", help=argparse.SUPPRESS)
idle.add_argument(p)
args = p.parse_args()
lengths = [int(n) for n in args.lengths.split(",")]

if args.hf_child:
    import torch
    import transformers
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096)).eval()
    with torch.inference_mode():
        for length in lengths:
            cache = DynamicCache()
            out = model(input_ids=torch.randint(0, 4096, (1, length)), cache=cache, use_cache=True, logits_to_keep=1)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            times = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                out = model(input_ids=nxt, cache=cache, use_cache=True, logits_to_keep=1)
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                times.append((time.perf_counter() - t0) * 1000)
            print(json.dumps({"length": length, "cached_ms": statistics.median(times)}), flush=True)
    sys.exit(0)

if not os.path.exists(args.bench):
    sys.exit(f"decode_steps.py: {args.bench} does not exist; build it (cmake --build build --target decode_steps)")
idle.wait(args.allow_load)
runs = {}
records = []
for side, command in (("dtrain", [args.bench, "--lengths", args.lengths, "--steps", str(args.steps), "--threads", "1"]),
                      ("transformers", [sys.executable, os.path.abspath(__file__), "--hf-child", "--lengths", args.lengths,
                                        "--steps", str(args.steps)])):
    with idle.Run() as load:
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    records.append(load.record)
    runs[side] = {r["length"]: r for r in map(json.loads, out.splitlines())}
verdict = idle.verdict(records)
print(f"{'cached length':>14} {'dtrain step ms':>15} {'transformers ms':>16} {'ratio':>6} {'dtrain uncached ms':>19}")
for length in lengths:
    d, h = runs["dtrain"][length], runs["transformers"][length]
    print(f"{length:>14} {d['cached_ms']:>15.3f} {h['cached_ms']:>16.3f} {h['cached_ms'] / d['cached_ms']:>5.2f}x "
          f"{d['uncached_ms']:>19.2f}")
first, last = runs["dtrain"][lengths[0]], runs["dtrain"][lengths[-1]]
print(f"dtrain: a step at {lengths[-1]} cached tokens costs {last['cached_ms'] / first['cached_ms']:.2f}x one at "
      f"{lengths[0]}; without the cache {last['uncached_ms'] / first['uncached_ms']:.1f}x")
print(json.dumps({"runs": runs, "load": verdict}))
idle.refuse(verdict, args.allow_load)
