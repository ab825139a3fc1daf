// SPDX-License-Identifier: Apache-2.0
// dtrain's library (DTRAIN_SEPARATE_COMPILATION): checkpoints on disk and the weights formats (safetensors, torch.save pickles), compiled once.
// Each impl/*.ipp holds the bodies its header declares; src/ includes each exactly once
// (tests/compile/check_sources.py).
#ifndef DTRAIN_SEPARATE_COMPILATION
#error "src/*.cpp build dtrain's library: compile them with DTRAIN_SEPARATE_COMPILATION defined (CMake: -DDTRAIN_SEPARATE_COMPILATION=ON)"
#endif

#include <dtrain/checkpointer/impl/checkpoint.ipp>
#include <dtrain/checkpointer/impl/files.ipp>
#include <dtrain/checkpointer/impl/model_config.ipp>
#include <dtrain/checkpointer/impl/optimizer_options.ipp>
#include <dtrain/checkpointer/impl/python_format.ipp>
#include <dtrain/checkpointer/impl/retention.ipp>
#include <dtrain/checkpointer/impl/selection.ipp>
#include <dtrain/checkpointer/impl/snapshot_buffers.ipp>
#include <dtrain/checkpointer/impl/state_files.ipp>
#include <dtrain/checkpointer/impl/write.ipp>
#include <dtrain/weights/detail/impl/mapped_file.ipp>
#include <dtrain/weights/impl/safetensors_index.ipp>
#include <dtrain/weights/impl/safetensors_reader.ipp>
#include <dtrain/weights/impl/safetensors_writer.ipp>
