// SPDX-License-Identifier: Apache-2.0
#pragma once
// tracker::tensorboard<Base>: another tracker's files (tracker::directory's by default, or
// tracker::mlflow<>'s), and the run as TensorBoard event files, so that
// `tensorboard --logdir <storage path>` shows every run of a storage path side by side.
//
// <run directory>/tensorboard/events.out.tfevents.<start time, s>.<host>.<its ms>   one per fit()
//
// An event file is a sequence of TFRecords: uint64 length, uint32 masked CRC32C of those 8 bytes,
// the data, uint32 masked CRC32C of the data (little endian). Each record's data is a serialized
// tensorflow.Event: the first holds file_version "brain.Event:2"; the second the run's params as
// a text summary (a markdown table, TensorBoard's Text tab); then one Event per report, at its step
// and time, with a Summary holding one scalar (simple_value, a float as TensorBoard's scalars are)
// per numeric metric, named as in metrics.csv; at the end the evaluations' metrics, at the last step.
//
// The protobuf encoding (varints, fixed64 doubles, fixed32 floats, length-delimited fields) and
// CRC32C (a 256-entry table) are written here by hand: a header-only library should not make every
// user link protobuf and a CRC library for four message types and one checksum.

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/error.hpp>
#include <dtrain/policy/category.hpp>
#include <dtrain/tracker/directory.hpp>
#include <dtrain/tracking/record.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracker {

namespace tensorboard_detail {

namespace fs = std::filesystem;

/// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses it.
std::uint32_t crc32c(const std::string& data);

/// TFRecord's masked CRC: rotated right by 15 bits, plus a constant.
std::uint32_t masked_crc(const std::string& data);

std::string little_endian(std::uint64_t v, int bytes);

/// One TFRecord around `data`.
std::string record(const std::string& data);

// ---- protobuf wire format: field key = (number << 3) | wire type ---------------------------------
std::string varint(std::uint64_t v);
inline std::string key(int field, int wire_type) { return varint(static_cast<std::uint64_t>(field) << 3 | wire_type); }
inline std::string int_field(int field, std::int64_t v) {  // wire type 0; negatives as 10 bytes
  return key(field, 0) + varint(static_cast<std::uint64_t>(v));
}
std::string double_field(int field, double v);
std::string float_field(int field, float v);
inline std::string bytes_field(int field, const std::string& v) {  // wire type 2
  return key(field, 2) + varint(v.size()) + v;
}

// ---- tensorflow/core/util/event.proto, framework/summary.proto, tensor.proto -------------------
/// Event{wall_time = 1, step = 2, file_version = 3 | summary = 5}.
inline std::string event(double wall_time, std::int64_t step, const std::string& what_field) {
  return double_field(1, wall_time) + int_field(2, step) + what_field;
}
/// Summary.Value{tag = 1, simple_value = 2}.
inline std::string scalar_value(const std::string& tag, double v) {
  return bytes_field(1, tag) + float_field(2, static_cast<float>(v));
}
/// Summary.Value{tag = 1, metadata = 9 {plugin_data = 1 {plugin_name = 1: "text"}},
/// tensor = 8 {dtype = 1: DT_STRING (7), tensor_shape = 2: {} (a scalar), string_val = 8}}.
std::string text_value(const std::string& tag, const std::string& text);
/// An Event whose Summary (field 5) holds `values` (each Summary.value, field 1).
std::string summary_event(double wall_time, std::int64_t step, const std::vector<std::string>& values);

/// The series a report row contributes: every numeric metric but the bookkeeping ones (as
/// tracker::mlflow<> records them).
bool is_series(const std::string& k, const Metric& v);

/// One report row as an Event (empty when the row has no series).
std::string row_event(const Metrics& row);

/// The params as a markdown table ("| key | value |"), '|' escaped.
std::string params_table(const nlohmann::json& params);

std::string host();

/// The run's event file is "events.out.tfevents.<start s>.<host>.<start ms, 3 digits>": the
/// prefix and suffix name one fit() (two of one name in one second apart), whatever the host that
/// rank 0's worker runs on.
std::pair<std::string, std::string> name_parts(const tracking::RunRecord& run);

/// The run's event file, as start() named it; empty when start() did not create one.
fs::path find_file(const fs::path& dir, const std::pair<std::string, std::string>& parts);

}  // namespace tensorboard_detail

/// Base's files (tracker::directory by default; tracker::mlflow<> composes: both are written), and
/// the run as a TensorBoard event file in <run directory>/tensorboard: the params when the run
/// starts, an Event per report appended by rank 0 while the run goes (live curves), and the whole
/// file rewritten from the history when it ends, with the evaluations' metrics at the last step.
template <class Base = directory>
struct tensorboard {
  static_assert(std::is_same_v<typename Base::category, dtrain::category::tracker>,
                "dtrain::tracker::tensorboard<Base>: Base is the tracker whose files are written beside the "
                "event files: tracker::directory (the default) or tracker::mlflow<>");
  using category = dtrain::category::tracker;
  static constexpr const char* name = "tensorboard";
  using base = Base;

  /// <run directory>/tensorboard: one log directory per run (`tensorboard --logdir` the storage
  /// path shows the runs by name).
  static std::filesystem::path log_directory(const std::filesystem::path& run_dir) { return run_dir / "tensorboard"; }

  /// The run's event file (start() created it); empty when there is none.
  static std::filesystem::path event_file(const tracking::RunRecord& run) {
    return tensorboard_detail::find_file(log_directory(run.path), tensorboard_detail::name_parts(run));
  }

  static void start(const tracking::RunRecord& run) {
    Base::start(run);
    write(run, false);
  }

  /// Rank 0's worker, after each report: Base's report (when it has one), then one Event appended.
  static void report(const tracking::RunRecord& run, const Metrics& row) {
    if constexpr (requires { Base::report(run, row); }) Base::report(run, row);
    const auto file = event_file(run);
    if (file.empty()) return;  // a worker under an external launcher: no start() of ours
    const auto bytes = tensorboard_detail::row_event(row);
    if (bytes.empty()) return;
    std::ofstream out(file, std::ios::app | std::ios::binary);
    out << bytes;
    out.flush();
    if (!out) throw Error(file.string() + ": cannot append an event (disk full or read-only?)");
  }

  static void heartbeat(const tracking::RunRecord& run) {
    if constexpr (requires { Base::heartbeat(run); }) Base::heartbeat(run);
  }

  static void end(const tracking::RunRecord& run) {
    Base::end(run);
    write(run, true);
  }

 private:
  /// The event file whole: the version, the params, and (at the end) every report and evaluation.
  static void write(const tracking::RunRecord& run, bool history) {
    namespace td = tensorboard_detail;
    const auto dir = log_directory(run.path);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir))
      throw Error("tracker::tensorboard: " + dir.string() + " cannot be made a directory (" +
                  (ec ? ec.message() : std::string("a file is in the way")) +
                  "); the event files go there. Check that the run directory is writable");
    auto file = event_file(run);
    if (file.empty()) file = dir / (td::name_parts(run).first + td::host() + td::name_parts(run).second);
    const double start_s = run.outcome.value("start_time", 0.0);
    std::string bytes = td::record(td::event(start_s, 0, td::bytes_field(3, "brain.Event:2")));
    bytes += td::summary_event(start_s, 0, {td::text_value("params", td::params_table(run.params))});
    if (history) {
      for (const auto& row : run.history.rows()) bytes += td::row_event(row);
      const std::int64_t last_step = run.history.empty() || !run.history.rows().back().count("step")
                                         ? 0
                                         : static_cast<std::int64_t>(run.history.rows().back().at("step").number());
      const double end_s = run.outcome.value("end_time", start_s);
      for (const auto& e : run.evaluations) {
        const auto metrics = e.value("metrics", nlohmann::json::object());
        std::vector<std::string> values;
        for (const auto& [k, v] : metrics.items())
          if (v.is_number()) values.push_back(td::scalar_value(e.value("name", std::string("evaluation")) + "/" + k, v.template get<double>()));
        if (!values.empty()) bytes += td::summary_event(e.value("time", end_s), last_step, values);
      }
    }
    tracking::write_atomically(file, bytes);
  }
};

}  // namespace tracker

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tracker/impl/tensorboard.ipp>
#endif
