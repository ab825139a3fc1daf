// SPDX-License-Identifier: Apache-2.0
#pragma once
// Classification metrics whose state is a confusion matrix: accumulated batch by batch on each
// rank, summed across ranks, so an evaluation split over N workers gives exactly the numbers of
// one process.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/error.hpp>
#include <dtrain/metrics.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace evaluation {

/// Counts of (true class, predicted class) pairs. Its state is integer counts, so merging the
/// matrices of any split of the data, in any order, gives the matrix of the whole.
class ConfusionMatrix {
 public:
  explicit ConfusionMatrix(std::int64_t num_classes);

  std::int64_t num_classes() const { return counts_.size(0); }

  /// Adds a batch: `predictions` are class indices [N] or scores [N, C] (argmax taken); `targets`
  /// are class indices [N].
  void update(const torch::Tensor& predictions, const torch::Tensor& targets);

  /// Adds another matrix's counts (the same classes).
  void merge(const ConfusionMatrix& other);

  /// Sums the matrices of all ranks into every rank's (exact: counts below 2^53).
  template <class Communicator>
  void all_reduce(Communicator& comm) {
    comm.allreduce(counts_, reduce::sum).wait();
  }

  /// counts[t][p]: samples of true class t predicted as p.
  const torch::Tensor& counts() const { return counts_; }
  /// The counts as rows of integers (counts_table()[t][p]), for files and reports.
  std::vector<std::vector<std::int64_t>> counts_table() const;
    std::int64_t total() const { return static_cast<std::int64_t>(counts_.sum().item<double>()); }

  double accuracy() const;

  /// Per class precision, recall and F1 (0 where undefined, as scikit-learn's zero_division=0),
  /// and support (samples of the class).
  struct PerClass {
    std::vector<double> precision, recall, f1, support;
  };
  PerClass per_class() const;

  /// accuracy, and precision, recall and F1 both macro (unweighted mean over classes) and weighted
  /// (mean weighted by support), as scikit-learn's classification_report computes them.
  Metrics summary(const std::string& prefix = "") const;

 private:
  torch::Tensor counts_;
};

}  // namespace evaluation

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/evaluation/impl/classification.ipp>
#endif
