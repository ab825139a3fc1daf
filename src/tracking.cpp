// SPDX-License-Identifier: Apache-2.0
// dtrain's library (DTRAIN_SEPARATE_COMPILATION): the run's record, report.html, the trackers (MLflow, TensorBoard) and evaluation, compiled once.
// Each impl/*.ipp holds the bodies its header declares; src/ includes each exactly once
// (tests/compile/check_sources.py).
#ifndef DTRAIN_SEPARATE_COMPILATION
#error "src/*.cpp build dtrain's library: compile them with DTRAIN_SEPARATE_COMPILATION defined (CMake: -DDTRAIN_SEPARATE_COMPILATION=ON)"
#endif

#include <dtrain/evaluation/impl/batch_predict.ipp>
#include <dtrain/evaluation/impl/classification.ipp>
#include <dtrain/evaluation/impl/predictor.ipp>
#include <dtrain/evaluation/impl/raw_inputs.ipp>
#include <dtrain/evaluation/impl/text_inputs.ipp>
#include <dtrain/tracker/impl/directory.ipp>
#include <dtrain/tracker/impl/mlflow.ipp>
#include <dtrain/tracker/impl/tensorboard.ipp>
#include <dtrain/tracking/impl/html.ipp>
#include <dtrain/tracking/impl/progress.ipp>
#include <dtrain/tracking/impl/progress_meter.ipp>
#include <dtrain/tracking/impl/record.ipp>
#include <dtrain/tracking/impl/report.ipp>
#include <dtrain/tracking/impl/report_timing.ipp>
#include <dtrain/tracking/impl/run_tracking.ipp>
#include <dtrain/tracking/impl/step_history.ipp>
