#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu.checkpoint_resume: a run on the GPU (fp16, the prefetcher, DDP) checkpoints after every
# epoch; one stopped after 2 of 4 epochs and started again resumes from its checkpoint and ends
# with bitwise the parameters of the uninterrupted run.
#   checkpoint_resume.sh TRAIN_GPU WORK_DIR
set -euo pipefail
bin=$1
rm -rf "$2" && mkdir -p "$2" && cd "$2"
common=(--model cnn --precision fp16 --samples 2048 --batch 256)
"$bin" "${common[@]}" --epochs 4 --name full --save full.pt
"$bin" "${common[@]}" --epochs 2 --name part
ls -d gpu_runs/part/checkpoint_* >/dev/null
resumed=$("$bin" "${common[@]}" --epochs 4 --name part --save resumed.pt | tee /dev/stderr | tail -1)
# The second start must have trained only the 2 epochs after the checkpoint, not all 4 again.
[[ $resumed == *'"epochs_run": 2}'* ]] || { echo "the restarted run did not resume from epoch 2: $resumed" >&2; exit 1; }
"$bin" --compare full.pt resumed.pt
