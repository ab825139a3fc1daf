// SPDX-License-Identifier: Apache-2.0
#pragma once
// dtrain's inference umbrella (docs/guide.md, "Serving and batch inference from a checkpoint"):
// evaluation::Predictor (a checkpoint's model serving raw inputs), evaluation::batch_predict (a
// whole dataset scored on N workers) and the validation helpers. ImageInputs needs OpenCV and is
// included by name: <dtrain/evaluation/image_inputs.hpp>.

#include <dtrain/evaluation/batch_predict.hpp>
#include <dtrain/evaluation/classification.hpp>
#include <dtrain/evaluation/predictor.hpp>
#include <dtrain/evaluation/text_inputs.hpp>
#include <dtrain/evaluation/validation.hpp>
#include <dtrain/tracking/report_timing.hpp>
