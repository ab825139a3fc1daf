// SPDX-License-Identifier: Apache-2.0
#pragma once
// dtrain::tune: hyperparameter search over a Trainer's loop (docs/tune.md).

#include <dtrain/tune/experiment.hpp>
#include <dtrain/tune/report.hpp>
#include <dtrain/tune/result_grid.hpp>
#include <dtrain/tune/scheduler.hpp>
#include <dtrain/tune/search.hpp>
#include <dtrain/tune/space.hpp>
#include <dtrain/tune/trial_process.hpp>
#include <dtrain/tune/tuner.hpp>
