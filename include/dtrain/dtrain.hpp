// SPDX-License-Identifier: Apache-2.0
#pragma once
// dtrain: data-parallel training for LibTorch, configured at compile time. The umbrella of a
// training program: the Trainer and its Context, every policy, the configs and the Result, the
// schedules, the built-in datasets (FashionMnist, TensorDataset) and the classification metrics.
// The other areas have umbrellas of their own, so that a program parses only what it uses:
// <dtrain/data.hpp> (files, pipelines, preprocessors, tokenizers), <dtrain/models.hpp> (BERT, ViT,
// CLIP, ResNet, the decoders Llama, Mistral, Qwen2 and GPT-2, LoRA, weights files),
// <dtrain/inference.hpp> (Predictor, batch_predict, validation),
// <dtrain/tune.hpp> (hyperparameter search), and <dtrain/all.hpp> all of them.

#include <dtrain/version.hpp>
#include <dtrain/error.hpp>
#include <dtrain/progress_mark.hpp>
#include <dtrain/config.hpp>
#include <dtrain/memory.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/result.hpp>
#include <dtrain/run_directory.hpp>

#include <dtrain/policy/category.hpp>
#include <dtrain/policy/concepts.hpp>
#include <dtrain/concept/checkpointer.hpp>
#include <dtrain/concept/sampler.hpp>
#include <dtrain/concept/tracker.hpp>
#include <dtrain/policy/resolve.hpp>
#include <dtrain/backend/gloo.hpp>
#include <dtrain/backend/nccl.hpp>
#include <dtrain/sampler/distributed.hpp>
#include <dtrain/sampler/cursor.hpp>
#include <dtrain/sampler/sequential.hpp>
#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/directory.hpp>
#include <dtrain/checkpointer/none.hpp>
#include <dtrain/strategy/ddp.hpp>
#include <dtrain/strategy/fsdp.hpp>
#include <dtrain/precision/fp32.hpp>
#include <dtrain/precision/amp.hpp>
#include <dtrain/precision/grad_scaler.hpp>
#include <dtrain/schedule/plateau.hpp>
#include <dtrain/schedule/schedule.hpp>
#include <dtrain/schedule/step_lr.hpp>
#include <dtrain/schedule/warmup_cosine.hpp>
#include <dtrain/tracker/directory.hpp>
#include <dtrain/tracker/mlflow.hpp>
#include <dtrain/tracker/none.hpp>
#include <dtrain/tracker/tensorboard.hpp>
#include <dtrain/tracking/progress.hpp>
#include <dtrain/tracking/record.hpp>

#include <dtrain/data/dataset.hpp>
#include <dtrain/data/fashion_mnist.hpp>
#include <dtrain/evaluation/classification.hpp>

#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/process.hpp>
#include <dtrain/launch/group.hpp>
#include <dtrain/launch/rendezvous.hpp>

#include <dtrain/context.hpp>
#include <dtrain/trainer.hpp>
