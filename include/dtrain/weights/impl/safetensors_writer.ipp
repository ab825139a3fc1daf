// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of safetensors_writer.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/weights/safetensors_writer.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace weights {
namespace detail {

DTRAIN_INLINE TempFile::TempFile(std::filesystem::path dest)
    : dest_(std::move(dest)),
      tmp_(dest_.parent_path() / ("." + dest_.filename().string() + ".tmp." + std::to_string(::getpid()))) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create " + tmp_.string());
}

DTRAIN_INLINE void TempFile::write(const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const auto w = ::write(fd_, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("cannot write " + tmp_.string());
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

DTRAIN_INLINE void TempFile::commit() {
  if (::fsync(fd_) != 0) fail("cannot fsync " + tmp_.string());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close " + tmp_.string());
  if (::rename(tmp_.c_str(), dest_.c_str()) != 0) fail("cannot rename " + tmp_.string() + " to it");
  done_ = true;
}
}  // namespace detail

DTRAIN_INLINE void save_safetensors(const std::filesystem::path& path,
                                    const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  detail::require_little_endian(path);
  const auto bad = [&](const std::string& name, const std::string& what) {
    return Error(path.string() + ": cannot write tensor \"" + name + "\": " + what);
  };
  struct Entry {
    std::string name;
    std::string_view dtype;
    torch::Tensor data;
    std::size_t element;
  };
  std::vector<Entry> entries;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") throw bad(name, "the name is empty or reserved; rename it");
    if (!names.insert(name).second) throw bad(name, "the name appears twice; each tensor needs its own");
    if (!t.defined()) throw bad(name, "it is an undefined tensor");
    if (t.layout() != torch::kStrided) throw bad(name, "it is sparse; save t.to_dense()");
    const auto dtype = detail::dtype_name(t.scalar_type());
    if (!dtype)
      throw bad(name, std::string("safetensors has no dtype for ") + c10::toString(t.scalar_type()) +
                          "; convert it (t.to(torch::kFloat)) first");
    auto data = t.detach().to(torch::kCPU).resolve_conj().resolve_neg().contiguous();
    entries.push_back({name, *dtype, std::move(data), static_cast<std::size_t>(t.element_size())});
  }
  // Largest elements first: every tensor starts at a multiple of its element size.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.element != b.element ? a.element > b.element : a.name < b.name;
  });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (const auto& e : entries) {
    const auto bytes = static_cast<std::uint64_t>(e.data.nbytes());
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.data.sizes().vec()}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(path.string() + ": a tensor name or metadata string is not UTF-8, as safetensors' JSON header needs (" +
                e.what() + ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t length = text.size();
  detail::TempFile out(path);
  out.write(&length, 8);
  out.write(text.data(), text.size());
  for (const auto& e : entries) out.write(e.data.data_ptr(), e.data.nbytes());
  out.commit();
}
}  // namespace weights
DTRAIN_NAMESPACE_END
