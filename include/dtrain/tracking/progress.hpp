// SPDX-License-Identifier: Apache-2.0
#pragma once
// Rank 0's live progress on stderr: one line redrawn in place on a terminal, a plain line every
// few seconds otherwise (a log file, a pipe, a batch system's output).

#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <dtrain/config.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracking {

/// What the progress line shows. Totals of 0 are unknown and left out.
struct ProgressSnapshot {
  std::int64_t epoch = 0, epochs = 0;     // epoch is 0-based; shown 1-based
  std::int64_t step = 0, total_steps = 0;  // optimizer steps so far (including a resumed run's)
  double samples_per_s = 0;                // over the whole group, since its first step
  double steps_per_s = 0;
  std::optional<double> loss;              // the last loss given to ctx.backward
};

/// "1:02:03" or "02:03" for a number of seconds.
std::string format_duration(double seconds);

/// The progress line's text: `epoch 1/2 | step 120/938 (13%) | 2451.3 samples/s | loss 0.4123 |
/// ETA 00:35`.
std::string format_progress(const ProgressSnapshot& p);

/// The verbosity in effect: DTRAIN_VERBOSITY (quiet, normal, verbose) over the configured one.
Verbosity effective_verbosity(Verbosity configured);

/// Draws the progress line on a file descriptor (stderr). Only rank 0 makes one that is enabled.
class Progress {
  using clock = std::chrono::steady_clock;

 public:
  Progress() = default;
  /// `enabled`: false on every rank but 0. `terminal`: redraw one line in place; when unset, taken
  /// from isatty(fd).
  Progress(const ProgressConfig& config, bool enabled, int fd = 2, std::optional<bool> terminal = std::nullopt);

  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() { close(); }

  bool enabled() const { return verbosity_ != Verbosity::quiet; }
  bool verbose() const { return verbosity_ == Verbosity::verbose; }
  bool terminal() const { return terminal_; }

  /// Whether a line is due now: one clock read, so it can be asked every step.
  bool due() const { return enabled() && clock::now() >= next_; }

  /// Draws `p` (in place on a terminal, as a new line otherwise) and schedules the next one.
  void draw(const ProgressSnapshot& p);

  /// A line of its own (a report under Verbosity::verbose): on a terminal the live line is
  /// cleared, the line printed, and the live line drawn again beneath it.
  void note(const std::string& line);

  /// Ends the live line with a newline, so what follows starts on a line of its own.
  void close() {
    if (terminal_ && !live_.empty()) write("\n");
    live_.clear();
  }

 private:
  // A line longer than the terminal wraps, and "\r" then redraws only its last part.
  std::string fit_width(const std::string& text) const;
  void write(const std::string& s) const;

  Verbosity verbosity_ = Verbosity::quiet;
  int fd_ = 2;
  bool terminal_ = false;
  std::chrono::milliseconds period_{1000};
  clock::time_point next_{};
  std::string live_;
};

}  // namespace tracking

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tracking/impl/progress.ipp>
#endif
