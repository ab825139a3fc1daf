// SPDX-License-Identifier: Apache-2.0
// dtrain's library (DTRAIN_SEPARATE_COMPILATION): hyperparameter search, compiled once.
// Each impl/*.ipp holds the bodies its header declares; src/ includes each exactly once
// (tests/compile/check_sources.py).
#ifndef DTRAIN_SEPARATE_COMPILATION
#error "src/*.cpp build dtrain's library: compile them with DTRAIN_SEPARATE_COMPILATION defined (CMake: -DDTRAIN_SEPARATE_COMPILATION=ON)"
#endif

#include <dtrain/tune/impl/experiment.ipp>
#include <dtrain/tune/impl/report.ipp>
#include <dtrain/tune/impl/result_grid.ipp>
#include <dtrain/tune/impl/scheduler.ipp>
#include <dtrain/tune/impl/search.ipp>
#include <dtrain/tune/impl/space.ipp>
#include <dtrain/tune/impl/trial_process.ipp>
#include <dtrain/tune/impl/tuner.ipp>
