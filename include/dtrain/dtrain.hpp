// SPDX-License-Identifier: Apache-2.0
#pragma once
// dtrain: data-parallel training for LibTorch, configured at compile time. The umbrella header.

#include <dtrain/version.hpp>
#include <dtrain/error.hpp>
#include <dtrain/progress_mark.hpp>
#include <dtrain/config.hpp>
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
#include <dtrain/tracking/report.hpp>

// Every data header that needs no optional library (docs/data.md's code compiles with this
// header alone); data/image.hpp and data/image_folder.hpp need OpenCV (dtrain::images) and are
// included by name, as is data/vit_image_processor.hpp.
#include <dtrain/data/collate.hpp>
#include <dtrain/data/csv.hpp>
#include <dtrain/data/csv_table.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/fashion_mnist.hpp>
#include <dtrain/data/fields.hpp>
#include <dtrain/data/files.hpp>
#include <dtrain/data/idx.hpp>
#include <dtrain/data/idx_cache.hpp>
#include <dtrain/data/jsonl.hpp>
#include <dtrain/data/loader.hpp>
#include <dtrain/data/pipeline.hpp>
#include <dtrain/data/prefetch.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/data/row.hpp>
#include <dtrain/data/sentencepiece.hpp>
#include <dtrain/data/shard.hpp>
#include <dtrain/data/splits.hpp>
#include <dtrain/data/text_file.hpp>
#include <dtrain/data/token_ids.hpp>
#include <dtrain/data/wordpiece.hpp>
#include <dtrain/evaluation/classification.hpp>
#include <dtrain/evaluation/predictor.hpp>
#include <dtrain/evaluation/batch_predict.hpp>
#include <dtrain/checkpointer/model_config.hpp>
#include <dtrain/tracking/report_timing.hpp>
#include <dtrain/nn/bert.hpp>
#include <dtrain/nn/bert_export.hpp>
#include <dtrain/nn/encoder.hpp>
#include <dtrain/nn/loss.hpp>
#include <dtrain/nn/packed.hpp>
#include <dtrain/nn/vit.hpp>
#include <dtrain/nn/resnet.hpp>
#include <dtrain/evaluation/validation.hpp>

#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/process.hpp>
#include <dtrain/launch/group.hpp>
#include <dtrain/launch/rendezvous.hpp>

#include <dtrain/context.hpp>
#include <dtrain/trainer.hpp>
#include <dtrain/weights.hpp>
#include <dtrain/tune.hpp>
