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
inline std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "--:--";
  const auto s = static_cast<long long>(std::llround(seconds));
  char buf[48];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%02lld:%02lld", s / 60, s % 60);
  return buf;
}

/// The progress line's text: `epoch 1/2 | step 120/938 (13%) | 2451.3 samples/s | loss 0.4123 |
/// ETA 00:35`.
inline std::string format_progress(const ProgressSnapshot& p) {
  char buf[96];
  std::string line = "epoch " + std::to_string(p.epoch + 1);
  if (p.epochs > 0) line += "/" + std::to_string(p.epochs);
  line += " | step " + std::to_string(p.step);
  if (p.total_steps > 0) {
    std::snprintf(buf, sizeof buf, "/%lld (%d%%)", static_cast<long long>(p.total_steps),
                  static_cast<int>(100.0 * static_cast<double>(std::min(p.step, p.total_steps)) /
                                   static_cast<double>(p.total_steps)));
    line += buf;
  }
  std::snprintf(buf, sizeof buf, " | %.1f samples/s", p.samples_per_s);
  line += buf;
  if (p.loss) {
    std::snprintf(buf, sizeof buf, " | loss %.4f", *p.loss);
    line += buf;
  }
  if (p.total_steps > 0) {
    const double left = p.total_steps > p.step && p.steps_per_s > 0
                            ? static_cast<double>(p.total_steps - p.step) / p.steps_per_s
                            : 0.0;
    line += " | ETA " + format_duration(left);
  }
  return line;
}

/// The verbosity in effect: DTRAIN_VERBOSITY (quiet, normal, verbose) over the configured one.
inline Verbosity effective_verbosity(Verbosity configured) {
  const char* v = std::getenv("DTRAIN_VERBOSITY");
  if (v == nullptr || *v == '\0') return configured;
  const std::string s = v;
  if (s == "quiet" || s == "0") return Verbosity::quiet;
  if (s == "normal" || s == "1") return Verbosity::normal;
  if (s == "verbose" || s == "2") return Verbosity::verbose;
  throw ConfigError("DTRAIN_VERBOSITY is \"" + s + "\"; use quiet, normal or verbose");
}

/// Draws the progress line on a file descriptor (stderr). Only rank 0 makes one that is enabled.
class Progress {
  using clock = std::chrono::steady_clock;

 public:
  Progress() = default;
  /// `enabled`: false on every rank but 0. `terminal`: redraw one line in place; when unset, taken
  /// from isatty(fd).
  Progress(const ProgressConfig& config, bool enabled, int fd = 2, std::optional<bool> terminal = std::nullopt)
      : verbosity_(enabled ? effective_verbosity(config.verbosity) : Verbosity::quiet),
        fd_(fd),
        terminal_(terminal.value_or(::isatty(fd) == 1)),
        period_(terminal_ ? config.refresh : config.interval),
        next_(clock::now() + (terminal_ ? config.refresh : config.interval)) {}

  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() { close(); }

  bool enabled() const { return verbosity_ != Verbosity::quiet; }
  bool verbose() const { return verbosity_ == Verbosity::verbose; }
  bool terminal() const { return terminal_; }

  /// Whether a line is due now: one clock read, so it can be asked every step.
  bool due() const { return enabled() && clock::now() >= next_; }

  /// Draws `p` (in place on a terminal, as a new line otherwise) and schedules the next one.
  void draw(const ProgressSnapshot& p) {
    if (!enabled()) return;
    next_ = clock::now() + period_;
    const std::string text = format_progress(p);
    if (terminal_) {
      live_ = fit_width(text);
      write("\r" + live_ + "\033[K");
    } else {
      write("dtrain: " + text + "\n");
    }
  }

  /// A line of its own (a report under Verbosity::verbose): on a terminal the live line is
  /// cleared, the line printed, and the live line drawn again beneath it.
  void note(const std::string& line) {
    if (!enabled()) return;
    if (terminal_ && !live_.empty()) write("\r\033[Kdtrain: " + line + "\n" + live_ + "\033[K");
    else write("dtrain: " + line + "\n");
  }

  /// Ends the live line with a newline, so what follows starts on a line of its own.
  void close() {
    if (terminal_ && !live_.empty()) write("\n");
    live_.clear();
  }

 private:
  // A line longer than the terminal wraps, and "\r" then redraws only its last part.
  std::string fit_width(const std::string& text) const {
    winsize ws{};
    if (::ioctl(fd_, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && text.size() >= ws.ws_col)
      return text.substr(0, ws.ws_col - 1);
    return text;
  }
  void write(const std::string& s) const {
    std::size_t done = 0;
    while (done < s.size()) {
      const auto w = ::write(fd_, s.data() + done, s.size() - done);
      if (w <= 0) return;  // progress is best effort: a closed stderr must not stop training
      done += static_cast<std::size_t>(w);
    }
  }

  Verbosity verbosity_ = Verbosity::quiet;
  int fd_ = 2;
  bool terminal_ = false;
  std::chrono::milliseconds period_{1000};
  clock::time_point next_{};
  std::string live_;
};

}  // namespace tracking

DTRAIN_NAMESPACE_END
