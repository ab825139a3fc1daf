// SPDX-License-Identifier: Apache-2.0
// dtrain's library (DTRAIN_SEPARATE_COMPILATION): the run's configuration, metrics, results and run directory; samplers, schedules, precision, strategies and the context, compiled once.
// Each impl/*.ipp holds the bodies its header declares; src/ includes each exactly once
// (tests/compile/check_sources.py).
#ifndef DTRAIN_SEPARATE_COMPILATION
#error "src/*.cpp build dtrain's library: compile them with DTRAIN_SEPARATE_COMPILATION defined (CMake: -DDTRAIN_SEPARATE_COMPILATION=ON)"
#endif

#include <dtrain/context/impl/core.ipp>
#include <dtrain/context/impl/stoppable.ipp>
#include <dtrain/impl/collective.ipp>
#include <dtrain/impl/config.ipp>
#include <dtrain/impl/memory.ipp>
#include <dtrain/impl/metrics.ipp>
#include <dtrain/impl/progress_mark.ipp>
#include <dtrain/impl/result.ipp>
#include <dtrain/impl/run_directory.ipp>
#include <dtrain/impl/weights.ipp>
#include <dtrain/precision/impl/blocked_adam.ipp>
#include <dtrain/precision/impl/dense_gradients.ipp>
#include <dtrain/precision/impl/grad_scaler.ipp>
#include <dtrain/sampler/impl/cursor.ipp>
#include <dtrain/sampler/impl/seed.ipp>
#include <dtrain/sampler/impl/sequential.ipp>
#include <dtrain/schedule/impl/plateau.ipp>
#include <dtrain/schedule/impl/schedule.ipp>
#include <dtrain/schedule/impl/step_lr.ipp>
#include <dtrain/schedule/impl/warmup_cosine.ipp>
#include <dtrain/strategy/detail/impl/ddp_reducer.ipp>
#include <dtrain/strategy/detail/impl/flat_storage.ipp>
#include <dtrain/strategy/detail/impl/fsdp_reshard.ipp>
#include <dtrain/strategy/detail/impl/gradient_hooks.ipp>
#include <dtrain/strategy/detail/impl/row_sparse.ipp>
#include <dtrain/strategy/impl/assignment.ipp>
