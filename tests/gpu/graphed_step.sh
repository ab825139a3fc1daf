#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu.graphed_step_*: the checkpointed CNN run (3 epochs of 2000 samples in batches of 256, the
# learning rate halved each epoch, a checkpoint after each) with its steps captured in a CUDA graph
# (ctx.graphed_step) ends with the parameters of the same run stepped ordinarily, within 1e-5. The
# graphed run must really have replayed: 3 warm-up steps, a capture in each epoch (the checkpoint
# renews the optimizer's state), 7 full batches per epoch replayed and the 208-sample last batch
# stepped outside the graph: 18 replays, 3 captures, 6 ordinary steps of 24.
#   graphed_step.sh TRAIN_GPU WORK_DIR sgd|adamw
set -euo pipefail
bin=$1 optimizer=$3
rm -rf "$2" && mkdir -p "$2" && cd "$2"
common=(--model cnn --precision fp32 --samples 2000 --batch 256 --epochs 3 --lr-decay 0.5 --optimizer "$optimizer")
"$bin" "${common[@]}" --name eager --save eager.pt
graphed=$("$bin" "${common[@]}" --graph 1 --name graphed --save graphed.pt | tee /dev/stderr | tail -1)
for want in '"replays": 18' '"captures": 3' '"eager_steps": 6' '"steps": 24'; do
  [[ $graphed == *"$want"* ]] || { echo "graphed run: expected $want in: $graphed" >&2; exit 1; }
done
"$bin" --compare-close eager.pt graphed.pt 1e-5
