// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::ImageFolder: ROOT/<class>/<file> read as torchvision's datasets.ImageFolder reads it - the
// same classes, the same files in the same order, the same labels - holding only the paths;
// `folder[i]` decodes image i (on the loader thread that asks for it, inside a pipeline).
//
//   const data::ImageFolder train("images/train", {.channels = 1});
//   auto ds = data::pipelined(train, data::map(data::random_horizontal_flip{0.5}) |
//                                        data::collate(data::stack_images{{0.2860f}, {0.3530f}}));

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <dtrain/data/image.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

struct ImageFolderOptions {
  /// 1: grey (PIL's convert("L")), 3: RGB (convert("RGB")).
  int channels = 3;
  /// The file names taken (compared lower-cased), torchvision's IMG_EXTENSIONS; other files are
  /// passed over, as torchvision passes them over.
  std::vector<std::string> extensions = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
};

/// The images under `root`, one class per sub-directory.
///
/// Classes: the sub-directories of `root` (symbolic links followed), sorted by name; class k is
/// the k-th. Samples: for each class in that order, every file under its directory (recursively,
/// directories in sorted path order, files sorted by name in each) whose name ends with one of the
/// extensions. This is torchvision 0.14's find_classes + make_dataset, so label i and file i are
/// the Python ImageFolder's.
///
/// Errors (DataError, naming the path): `root` is not a directory; it holds no class directory; a
/// class directory holds no image file (torchvision refuses that folder too). A file that cannot
/// be read or decoded is an error when it is decoded, naming the file; inside a pipeline it is
/// thrown from the training loop at its batch's turn. Nothing is skipped silently.
class ImageFolder {
 public:
  explicit ImageFolder(std::filesystem::path root, ImageFolderOptions options = {})
      : root_(std::move(root)), options_(std::move(options)) {
    namespace fs = std::filesystem;
    if (options_.channels != 1 && options_.channels != 3)
      throw ConfigError("ImageFolder: channels must be 1 (grey) or 3 (RGB), got " + std::to_string(options_.channels));
    std::error_code ec;
    if (!fs::is_directory(root_, ec))
      throw DataError(root_.string() + ": not a directory; an image folder is ROOT/<class>/<image files>");
    std::error_code not_a_dir;  // a broken link: not a class
    for (fs::directory_iterator it(root_, fs::directory_options::follow_directory_symlink, ec), end; !ec && it != end;
         it.increment(ec))
      if (it->is_directory(not_a_dir)) classes_.push_back(it->path().filename().string());
    if (ec) throw DataError(root_.string() + ": cannot be listed (" + ec.message() + ")");
    std::sort(classes_.begin(), classes_.end());
    if (classes_.empty())
      throw DataError(root_.string() + ": holds no class directory; an image folder is ROOT/<class>/<image files>");
    std::vector<std::string> empty;
    for (std::size_t k = 0; k < classes_.size(); ++k) {
      const auto before = paths_.size();
      add_class(root_ / classes_[k], static_cast<std::int64_t>(k));
      if (paths_.size() == before) empty.push_back((root_ / classes_[k]).string());
    }
    if (!empty.empty()) {
      std::string names;
      for (const auto& e : empty) names += (names.empty() ? "" : ", ") + e;
      throw DataError("no image file in " + names + " (extensions " + extensions_text() +
                      "); remove the empty class directory or add its images");
    }
  }

  std::int64_t size() const { return static_cast<std::int64_t>(paths_.size()); }
  /// Image i, decoded now: its pixels, label and path.
  Image operator[](std::int64_t i) const {
    check(i);
    const auto k = static_cast<std::size_t>(i);
    return Image{decode_image(paths_[k], options_.channels), labels_[k], paths_[k]};
  }
  const std::string& path(std::int64_t i) const { return check(i), paths_[static_cast<std::size_t>(i)]; }
  std::int64_t label(std::int64_t i) const { return check(i), labels_[static_cast<std::size_t>(i)]; }
  /// The class names, label k being classes()[k].
  const std::vector<std::string>& classes() const { return classes_; }
  const std::filesystem::path& root() const { return root_; }
  int channels() const { return options_.channels; }

 private:
  void check(std::int64_t i) const {
    if (i < 0 || i >= size())
      throw DataError("image " + std::to_string(i) + " is outside [0, " + std::to_string(size()) + ") of " +
                      root_.string());
  }
  bool wanted(const std::string& name) const {
    std::string lower = name;
    for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    for (const auto& ext : options_.extensions)
      if (lower.size() >= ext.size() && lower.compare(lower.size() - ext.size(), ext.size(), ext) == 0) return true;
    return false;
  }
  std::string extensions_text() const {
    std::string s;
    for (const auto& e : options_.extensions) s += (s.empty() ? "" : " ") + e;
    return s;
  }
  // os.walk(dir, followlinks=True), sorted: every directory's path in byte order (Python's string
  // order for UTF-8 names), then the non-directory entries of each, sorted by name.
  void add_class(const std::filesystem::path& dir, std::int64_t label) {
    namespace fs = std::filesystem;
    std::error_code ec, not_a_dir;  // a broken link is a file here, as os.walk lists it
    std::vector<std::string> dirs{dir.string()};
    for (fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end;
         !ec && it != end; it.increment(ec))
      if (it->is_directory(not_a_dir)) dirs.push_back(it->path().string());
    if (ec) throw DataError(dir.string() + ": cannot be listed (" + ec.message() + ")");
    std::sort(dirs.begin(), dirs.end());
    for (const auto& d : dirs) {
      std::vector<std::string> names;
      for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec))
        if (!it->is_directory(not_a_dir) && wanted(it->path().filename().string()))
          names.push_back(it->path().filename().string());
      if (ec) throw DataError(d + ": cannot be listed (" + ec.message() + ")");
      std::sort(names.begin(), names.end());
      for (const auto& n : names) {
        paths_.push_back((fs::path(d) / n).string());
        labels_.push_back(label);
      }
    }
  }

  std::filesystem::path root_;
  ImageFolderOptions options_;
  std::vector<std::string> classes_, paths_;
  std::vector<std::int64_t> labels_;
};

}  // namespace data

DTRAIN_NAMESPACE_END
