// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of progress.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tracking/progress.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tracking {

DTRAIN_INLINE std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "--:--";
  const auto s = static_cast<long long>(std::llround(seconds));
  char buf[48];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%02lld:%02lld", s / 60, s % 60);
  return buf;
}

DTRAIN_INLINE std::string format_progress(const ProgressSnapshot& p) {
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

DTRAIN_INLINE Verbosity effective_verbosity(Verbosity configured) {
  const char* v = std::getenv("DTRAIN_VERBOSITY");
  if (v == nullptr || *v == '\0') return configured;
  const std::string s = v;
  if (s == "quiet" || s == "0") return Verbosity::quiet;
  if (s == "normal" || s == "1") return Verbosity::normal;
  if (s == "verbose" || s == "2") return Verbosity::verbose;
  throw ConfigError("DTRAIN_VERBOSITY is \"" + s + "\"; use quiet, normal or verbose");
}

DTRAIN_INLINE Progress::Progress(const ProgressConfig& config, bool enabled, int fd, std::optional<bool> terminal)
    : verbosity_(enabled ? effective_verbosity(config.verbosity) : Verbosity::quiet),
      fd_(fd),
      terminal_(terminal.value_or(::isatty(fd) == 1)),
      period_(terminal_ ? config.refresh : config.interval),
      next_(clock::now() + (terminal_ ? config.refresh : config.interval)) {}

DTRAIN_INLINE void Progress::draw(const ProgressSnapshot& p) {
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

DTRAIN_INLINE void Progress::note(const std::string& line) {
  if (!enabled()) return;
  if (terminal_ && !live_.empty()) write("\r\033[Kdtrain: " + line + "\n" + live_ + "\033[K");
  else write("dtrain: " + line + "\n");
}

DTRAIN_INLINE std::string Progress::fit_width(const std::string& text) const {
  winsize ws{};
  if (::ioctl(fd_, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && text.size() >= ws.ws_col)
    return text.substr(0, ws.ws_col - 1);
  return text;
}

DTRAIN_INLINE void Progress::write(const std::string& s) const {
  std::size_t done = 0;
  while (done < s.size()) {
    const auto w = ::write(fd_, s.data() + done, s.size() - done);
    if (w <= 0) return;  // progress is best effort: a closed stderr must not stop training
    done += static_cast<std::size_t>(w);
  }
}
}  // namespace tracking
DTRAIN_NAMESPACE_END
