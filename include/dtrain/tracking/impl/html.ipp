// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of html.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tracking/html.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tracking {
namespace html {

DTRAIN_INLINE std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

DTRAIN_INLINE std::string number(double v, int precision) {
  if (std::isnan(v)) return "NaN";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", precision, v);
  return buf;
}

DTRAIN_INLINE std::string utc(double unix_s) {
  if (!(unix_s > 0)) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

DTRAIN_INLINE std::string duration(double seconds) {
  if (!std::isfinite(seconds)) return number(seconds);
  std::string s = number(seconds, seconds < 1 ? 3 : 4) + " s";
  if (std::abs(seconds) < 60) return s;
  const auto whole = static_cast<long long>(std::llround(std::abs(seconds)));
  char buf[48];
  if (whole >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", whole / 3600, whole / 60 % 60, whole % 60);
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", whole / 60, whole % 60);
  return s + " (" + (seconds < 0 ? "-" : "") + buf + ")";
}

DTRAIN_INLINE std::string value_text(std::string_view name, const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "-";
  if (!v.is_number()) return v.dump();
  const double x = v.get<double>();
  if (name == "timestamp" || name.ends_with("_unix")) return utc(x);
  if (name.ends_with("_s") && !name.ends_with("_per_s")) return duration(x);
  if (name.find("bytes") != std::string_view::npos && x >= 1024) {
    const char* unit[] = {"KiB", "MiB", "GiB", "TiB"};
    double scaled = x / 1024;
    int u = 0;
    for (; scaled >= 1024 && u < 3; ++u) scaled /= 1024;
    return number(scaled, 4) + " " + unit[u] + " (" + number(x, 15) + " bytes)";
  }
  return v.is_number_integer() ? v.dump() : number(x);
}

DTRAIN_INLINE std::string table(const std::string& id, const std::vector<std::string>& header,
                                const std::vector<std::vector<std::string>>& rows) {
  std::string s = "<table id=\"" + escape(id) + "\"><tr>";
  for (const auto& h : header) s += "<th>" + escape(h) + "</th>";
  s += "</tr>";
  for (const auto& row : rows) {
    s += "<tr>";
    for (const auto& cell : row) s += "<td>" + escape(cell) + "</td>";
    s += "</tr>";
  }
  return s + "</table>";
}

DTRAIN_INLINE std::vector<double> ticks(double lo, double hi, int n) {
  std::vector<double> out;
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag >= 5 ? 5 * mag : raw / mag >= 2 ? 2 * mag : mag;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

DTRAIN_INLINE std::size_t Series::points() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < xs.size() && i < ys.size(); ++i) n += std::isfinite(xs[i]) && std::isfinite(ys[i]);
  return n;
}

DTRAIN_INLINE std::string line_chart(const std::string& id, const std::string& title, const std::string& x_label,
                                     const std::vector<Series>& series, const std::vector<Marker>& markers) {
  // Tableau's ten, less the red that marks restarts.
  static constexpr const char* colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
                                            "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  static constexpr std::size_t n_colours = std::size(colours), most_points = 1000, dotted_up_to = 60;
  const bool legend =
      series.size() > 1 || std::any_of(series.begin(), series.end(), [](const Series& s) { return !s.label.empty(); });
  const double W = 480, left = 62, right = 16, bottom = 42;
  // The legend's entries, row by row: a row ends where the next entry would pass the frame.
  std::vector<std::pair<double, int>> entry_at;  // x, row
  int rows = 0;
  if (legend) {
    double x = left;
    for (const auto& se : series) {
      const double width = 32 + 6.2 * static_cast<double>((se.label.empty() ? se.name : se.label).size());
      if (x > left && x + width - 12 > W - right) x = left, ++rows;
      entry_at.emplace_back(x, rows);
      x += width;
    }
    ++rows;
  }
  const double top = 30 + 20 * rows, H = 270 + 20 * rows;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  std::vector<std::vector<std::pair<double, double>>> lines;
  for (const auto& s : series) {
    auto& pts = lines.emplace_back();
    const std::size_t n = s.points(), stride = n > most_points ? (n + most_points - 1) / most_points : 1;
    std::size_t seen = 0;
    for (std::size_t i = 0; i < s.xs.size() && i < s.ys.size(); ++i) {
      if (!std::isfinite(s.xs[i]) || !std::isfinite(s.ys[i])) continue;
      if (seen++ % stride != 0 && seen != n) continue;  // thinned, the last point always kept
      pts.emplace_back(s.xs[i], s.ys[i]);
      x0 = std::min(x0, s.xs[i]);
      x1 = std::max(x1, s.xs[i]);
      y0 = std::min(y0, s.ys[i]);
      y1 = std::max(y1, s.ys[i]);
    }
  }
  if (!(x1 >= x0)) return "";
  for (const auto& m : markers)
    if (std::isfinite(m.x)) {
      x0 = std::min(x0, m.x);
      x1 = std::max(x1, m.x);
    }
  if (x1 <= x0) { x0 -= 1; x1 += 1; }
  const double pad = y1 > y0 ? (y1 - y0) * 0.05 : y0 == 0 ? 1 : std::abs(y0) * 0.05;
  y0 -= pad;
  y1 += pad;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (W - left - right); };
  auto py = [&](double y) { return H - bottom - (y - y0) / (y1 - y0) * (H - top - bottom); };
  std::string s = "<figure class=\"chart\" id=\"" + escape(id) + "\"><svg xmlns=\"http://www.w3.org/2000/svg\" "
                  "class=\"curve\" data-metric=\"" + escape(title) + "\" width=\"" + number(W) + "\" height=\"" +
                  number(H) + "\" viewBox=\"0 0 " + number(W) + " " + number(H) + "\" role=\"img\">";
  s += "<title>" + escape(title) + " by " + escape(x_label) + "</title>";
  s += "<text x=\"" + number(W / 2) + "\" y=\"18\" text-anchor=\"middle\" class=\"title\">" + escape(title) + "</text>";
  for (std::size_t i = 0; i < entry_at.size(); ++i) {
    const std::string text = series[i].label.empty() ? series[i].name : series[i].label;
    const auto [x, row] = entry_at[i];
    const double y = 34 + 20 * row;
    s += "<g class=\"legend\"><line x1=\"" + number(x) + "\" x2=\"" + number(x + 16) + "\" y1=\"" + number(y) +
         "\" y2=\"" + number(y) + "\" stroke=\"" + colours[i % n_colours] + "\" stroke-width=\"3\"/><text class=\"tick\" x=\"" +
         number(x + 20) + "\" y=\"" + number(y + 4) + "\">" + escape(text) + "</text></g>";
  }
  for (double t : ticks(y0, y1)) {
    const double y = py(t);
    s += "<line class=\"grid\" x1=\"" + number(left) + "\" x2=\"" + number(W - right) + "\" y1=\"" + number(y) +
         "\" y2=\"" + number(y) + "\"/><text class=\"tick\" x=\"" + number(left - 6) + "\" y=\"" + number(y + 4) +
         "\" text-anchor=\"end\">" + number(t, 7) + "</text>";
  }
  for (double t : ticks(x0, x1)) {
    const double x = px(t);
    s += "<line class=\"grid\" x1=\"" + number(x) + "\" x2=\"" + number(x) + "\" y1=\"" + number(top) + "\" y2=\"" +
         number(H - bottom) + "\"/><text class=\"tick\" x=\"" + number(x) + "\" y=\"" + number(H - bottom + 16) +
         "\" text-anchor=\"middle\">" + number(t, 7) + "</text>";
  }
  s += "<rect class=\"frame\" x=\"" + number(left) + "\" y=\"" + number(top) + "\" width=\"" + number(W - left - right) +
       "\" height=\"" + number(H - top - bottom) + "\"/>";
  s += "<text class=\"axis\" x=\"" + number((left + W - right) / 2) + "\" y=\"" + number(H - 6) +
       "\" text-anchor=\"middle\">" + escape(x_label) + "</text>";
  for (const auto& m : markers) {
    if (!std::isfinite(m.x)) continue;
    const double x = px(m.x);
    s += "<line class=\"restart\" x1=\"" + number(x) + "\" x2=\"" + number(x) + "\" y1=\"" + number(top) +
         "\" y2=\"" + number(H - bottom) + "\"><title>" + escape(m.label) + "</title></line>";
  }
  for (std::size_t i = 0; i < series.size(); ++i) {
    const auto& pts = lines[i];
    if (pts.empty()) continue;
    const std::string colour = colours[i % n_colours];
    std::string poly;
    for (const auto& [x, y] : pts) poly += number(px(x)) + "," + number(py(y)) + " ";
    s += "<polyline class=\"line\" stroke=\"" + colour + "\" data-series=\"" + escape(series[i].name) +
         "\" data-points=\"" + std::to_string(series[i].points()) + "\" points=\"" + poly + "\"/>";
    if (pts.size() > dotted_up_to) continue;
    for (const auto& [x, y] : pts)
      s += "<circle class=\"point\" fill=\"" + colour + "\" cx=\"" + number(px(x)) + "\" cy=\"" + number(py(y)) +
           "\" r=\"3\"><title>" + escape(series[i].name) + ", " + escape(x_label) + " " + number(x) + ": " +
           number(y) + "</title></circle>";
  }
  return s + "</svg></figure>";
}
}  // namespace html
}  // namespace tracking
DTRAIN_NAMESPACE_END
