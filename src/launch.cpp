// SPDX-License-Identifier: Apache-2.0
// dtrain's library (DTRAIN_SEPARATE_COMPILATION): processes, the store, rendezvous, heartbeats and restarts; the backends and their shared-memory and Gloo transports, compiled once.
// Each impl/*.ipp holds the bodies its header declares; src/ includes each exactly once
// (tests/compile/check_sources.py).
#ifndef DTRAIN_SEPARATE_COMPILATION
#error "src/*.cpp build dtrain's library: compile them with DTRAIN_SEPARATE_COMPILATION defined (CMake: -DDTRAIN_SEPARATE_COMPILATION=ON)"
#endif

#include <dtrain/backend/detail/impl/gloo_peers.ipp>
#include <dtrain/backend/impl/gloo.ipp>
#include <dtrain/backend/detail/impl/hierarchical.ipp>
#include <dtrain/detail/impl/buffer_sync.ipp>
#include <dtrain/detail/impl/memory.ipp>
#include <dtrain/detail/impl/serial_tasks.ipp>
#include <dtrain/detail/impl/sha256.ipp>
#include <dtrain/detail/impl/shm_allreduce.ipp>
#include <dtrain/detail/impl/torch_compat.ipp>
#include <dtrain/detail/impl/type_name.ipp>
#include <dtrain/detail/impl/generator_scope.ipp>
#include <dtrain/detail/impl/torch_pickle.ipp>
#include <dtrain/launch/impl/elastic.ipp>
#include <dtrain/launch/impl/environment.ipp>
#include <dtrain/launch/impl/fresh_start.ipp>
#include <dtrain/launch/impl/group.ipp>
#include <dtrain/launch/impl/heartbeat.ipp>
#include <dtrain/launch/impl/liveness.ipp>
#include <dtrain/launch/impl/process.ipp>
#include <dtrain/launch/impl/rendezvous.ipp>
#include <dtrain/launch/impl/restarts.ipp>
#include <dtrain/launch/impl/stop.ipp>
#include <dtrain/launch/impl/store.ipp>
#include <dtrain/launch/impl/store_server.ipp>
#include <dtrain/launch/impl/store_wire.ipp>
#include <dtrain/launch/impl/worker_threads.ipp>
