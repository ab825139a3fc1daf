// SPDX-License-Identifier: Apache-2.0
#pragma once
// The memory a checkpoint's snapshot is copied into on the training thread, where
// copying into fresh memory stalled the training loop (docs/checkpoints.md).
//
// ctx.checkpoint() copies the model and (for a torch optimizer) hands the optimizer copies of its
// state, hundreds of MB for a large model. Copied into freshly allocated memory, most of that time
// is the kernel faulting the pages in one 4 KiB page at a time. SnapshotBuffers keeps the tensors of
// the previous snapshot once its write is done and copies the next one into them (memory already
// faulted in); a tensor it allocates afresh asks for transparent huge pages (2 MiB a fault).

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>

#include <ATen/core/Dict.h>
#include <ATen/ops/from_blob.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer::detail {

/// A CPU tensor of `source`'s sizes, strides and dtype (what source.clone() gives for a dense
/// tensor), uninitialized, in memory of its own: 2 MiB-aligned and advised MADV_HUGEPAGE when it
/// is 2 MiB or more, so that filling it takes one page fault per 2 MiB where the kernel's
/// transparent huge pages are `madvise` (Debian's default) or `always`, and faulted in by one
/// madvise call. (On the development VM this took 0.16 to 2.9 s for 352 MB where clone() took 3.5
/// to 4.2 s, at load average 7: fresh memory is costly there, reused memory 0.05 s.)
at::Tensor huge_page_tensor_like(const at::Tensor& source);

/// The tensors of the previous snapshot, by name, for the next snapshot to copy into. A kept
/// tensor is reused only when nothing else references it or its storage any more (the write that
/// read it is done and its Snapshot destroyed, and the user kept no copy of the Snapshot) and its
/// layout is the one a fresh clone would have; otherwise the copy goes into new memory, so a
/// reused buffer and a fresh one write the same bytes. CPU tensors only: a GPU's caching allocator
/// already reuses its memory, and kept GPU buffers would hold device memory between checkpoints.
///
/// The cost is memory: the kept tensors (one copy of the model and of the optimizer's state) stay
/// allocated between checkpoints, where before they were freed after each write.
class SnapshotBuffers {
 public:
  /// A copy of `source` (detached): into the buffer kept under `name` when it can be reused, else
  /// into new memory.
  at::Tensor copy(const std::string& name, const at::Tensor& source);

  /// Keeps `tensor`'s memory under `name` for the next snapshot (CPU tensors only). What is kept is
  /// another tensor over the same storage, not `tensor` itself: torch's pickler memoizes a tensor
  /// referenced more than once, so holding `tensor` would change the bytes its snapshot writes.
  void keep(const std::string& name, const at::Tensor& tensor);

  /// Ends a snapshot: what it kept becomes what the next one may reuse; buffers it did not ask for
  /// (a parameter that is gone) are let go.
  void finish() {
    kept_ = std::move(next_);
    next_.clear();
  }

  /// A module's parameters and buffers by their dotted names, as named_state(module, true) gives
  /// them, copied into the buffers of the previous snapshot where they can be reused.
  c10::Dict<std::string, at::Tensor> model_state(const torch::nn::Module& module);

  /// Copies made into kept buffers and into new memory since this object was made.
  std::int64_t reused() const { return reused_; }
  std::int64_t allocated() const { return allocated_; }

 private:
  static bool reusable(const at::Tensor& buffer, const at::Tensor& source);

  std::unordered_map<std::string, at::Tensor> kept_, next_;
  std::int64_t reused_ = 0, allocated_ = 0;
};

}  // namespace checkpointer::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/checkpointer/impl/snapshot_buffers.ipp>
#endif
