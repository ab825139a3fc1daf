// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::Image and the image stages of a pipeline, each the counterpart of a torchvision transform:
//   decode_image       PIL's Image.open(f).convert("L" | "RGB"): OpenCV's imgcodecs decodes, then
//                      PIL's own conversions, so an 8-bit image's pixels equal PIL's bit for bit
//   resize             transforms.Resize on a PIL image: PIL's bilinear filter, antialiased when
//                      shrinking (OpenCV's INTER_LINEAR is not, and lands many grey levels away)
//   center_crop, random_crop, random_horizontal_flip
//   stack_images       the collate stage: ToTensor + Normalize into one float [B, C, H, W] batch,
//                      computed as torchvision computes them (x / 255, then (x - mean) / std)
// Random stages draw from the generator the pipeline hands each sample (data/pipeline.hpp), so the
// batches are the same for any loader thread count and a resumed run draws what it would have.
//
// OpenCV is a dependency of these headers alone: link the CMake target dtrain::images.

#if !__has_include(<opencv2/core.hpp>) || !__has_include(<opencv2/imgcodecs.hpp>)
#error "<dtrain/data/image.hpp> and <dtrain/data/image_folder.hpp> need OpenCV (Debian: apt-get install libopencv-dev): link the CMake target dtrain::images, which dtrain defines when find_package(OpenCV COMPONENTS core imgcodecs imgproc) succeeds"
#endif

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <torch/types.h>

#include <dtrain/data/fields.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// One decoded image: 8-bit pixels, rows x columns x channels (1: grey, 3: R, G, B in that order),
/// its class, and the file it came from (named in errors).
struct Image {
  cv::Mat pixels;
  std::int64_t label = -1;
  std::string path;
};

namespace detail {

// PIL's rgb2l (Convert.c): ITU-R 601-2 luma in 16-bit fixed point, rounded: the 299/587/114
// weights of PIL's documentation, as its code computes them.
inline std::uint8_t pil_luma(unsigned r, unsigned g, unsigned b) {
  return static_cast<std::uint8_t>((r * 19595u + g * 38470u + b * 7471u + 0x8000u) >> 16);
}

// OpenCV's decoded pixels (grey, grey+alpha, BGR or BGRA) as PIL's convert("L") or ("RGB") gives
// them: alpha dropped (not blended), grey replicated, colour to grey through pil_luma.
inline cv::Mat pil_convert(const cv::Mat& in, int channels, const std::string& path) {
  const int cn = in.channels();
  if (cn != 1 && cn != 2 && cn != 3 && cn != 4)
    throw DataError(path + ": an image with " + std::to_string(cn) + " channels; grey, grey+alpha, RGB and RGBA are read");
  if (cn == 1 && channels == 1) return in;
  cv::Mat out(in.rows, in.cols, channels == 1 ? CV_8UC1 : CV_8UC3);
  for (int y = 0; y < in.rows; ++y) {
    const std::uint8_t* s = in.ptr<std::uint8_t>(y);
    std::uint8_t* d = out.ptr<std::uint8_t>(y);
    for (int x = 0; x < in.cols; ++x, s += cn) {
      if (cn <= 2) {  // grey (+ alpha)
        if (channels == 1) d[x] = s[0];
        else d[3 * x] = d[3 * x + 1] = d[3 * x + 2] = s[0];
      } else if (channels == 1) {
        d[x] = pil_luma(s[2], s[1], s[0]);
      } else {
        d[3 * x] = s[2], d[3 * x + 1] = s[1], d[3 * x + 2] = s[0];
      }
    }
  }
  return out;
}

// A uniform double in [0, 1) from the sample's generator.
inline double uniform(at::Generator& g) {
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(g);
  std::lock_guard<std::mutex> lock(g.mutex());
  return static_cast<double>(impl->random64() >> 11) * (1.0 / 9007199254740992.0);
}
// A uniform integer in [0, n].
inline int uniform_int(at::Generator& g, int n) {
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(g);
  std::lock_guard<std::mutex> lock(g.mutex());
  return static_cast<int>(impl->random64() % static_cast<std::uint64_t>(n + 1));
}

/// PIL's resampling filters (Image.Resampling): BILINEAR (2, torchvision's and ViT's) and BICUBIC (3, CLIP's).
enum class Resample { bilinear = 2, bicubic = 3 };

// PIL's filters (Resample.c): the triangle of support 1, and Keys' cubic with a = -0.5 of support 2.
inline double pil_filter(Resample f, double x) {
  x = std::abs(x);
  if (f == Resample::bilinear) return x < 1.0 ? 1.0 - x : 0.0;
  constexpr double a = -0.5;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// PIL's precompute_coeffs + normalize_coeffs_8bpc (Resample.c): for each output position, the
// first input index, the count, and 22-bit fixed-point weights.
struct ResampleAxis {
  static constexpr int kPrecisionBits = 32 - 8 - 2;
  std::vector<int> first, count;
  std::vector<std::int32_t> weights;  // `ksize` per output position
  int ksize = 0;

  ResampleAxis(int in_size, int out_size, Resample filter) {
    const double scale = static_cast<double>(in_size) / out_size;
    const double filterscale = scale < 1.0 ? 1.0 : scale;
    const double support = (filter == Resample::bilinear ? 1.0 : 2.0) * filterscale;
    ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
    first.resize(static_cast<std::size_t>(out_size));
    count.resize(static_cast<std::size_t>(out_size));
    weights.assign(static_cast<std::size_t>(out_size) * static_cast<std::size_t>(ksize), 0);
    std::vector<double> k(static_cast<std::size_t>(ksize));
    for (int xx = 0; xx < out_size; ++xx) {
      const double center = (xx + 0.5) * scale;
      const double ss = 1.0 / filterscale;
      int xmin = static_cast<int>(center - support + 0.5);
      if (xmin < 0) xmin = 0;
      int xmax = static_cast<int>(center + support + 0.5);
      if (xmax > in_size) xmax = in_size;
      xmax -= xmin;
      double ww = 0.0;
      for (int x = 0; x < xmax; ++x) {
        k[static_cast<std::size_t>(x)] = pil_filter(filter, (x + xmin - center + 0.5) * ss);
        ww += k[static_cast<std::size_t>(x)];
      }
      for (int x = 0; x < xmax; ++x) {
        const double w = ww != 0.0 ? k[static_cast<std::size_t>(x)] / ww : k[static_cast<std::size_t>(x)];
        weights[static_cast<std::size_t>(xx * ksize + x)] =
            static_cast<std::int32_t>(w < 0 ? -0.5 + w * (1 << kPrecisionBits) : 0.5 + w * (1 << kPrecisionBits));
      }
      first[static_cast<std::size_t>(xx)] = xmin;
      count[static_cast<std::size_t>(xx)] = xmax;
    }
  }
  static std::uint8_t clip8(std::int32_t v) {
    if (v >= (1 << kPrecisionBits) << 8) return 255;
    if (v <= 0) return 0;
    return static_cast<std::uint8_t>(v >> kPrecisionBits);
  }
};

// PIL's ImagingResample for 8-bit images: a horizontal pass, then a vertical one, each rounding
// to 8 bits (skipped along an axis whose size does not change).
inline cv::Mat pil_resize(const cv::Mat& in, int out_h, int out_w, Resample filter) {
  const int cn = in.channels();
  cv::Mat cur = in;
  if (out_w != in.cols) {
    const ResampleAxis ax(in.cols, out_w, filter);
    cv::Mat tmp(cur.rows, out_w, in.type());
    for (int y = 0; y < cur.rows; ++y) {
      const std::uint8_t* s = cur.ptr<std::uint8_t>(y);
      std::uint8_t* d = tmp.ptr<std::uint8_t>(y);
      for (int xx = 0; xx < out_w; ++xx) {
        const std::int32_t* k = &ax.weights[static_cast<std::size_t>(xx * ax.ksize)];
        const int x0 = ax.first[static_cast<std::size_t>(xx)], n = ax.count[static_cast<std::size_t>(xx)];
        for (int c = 0; c < cn; ++c) {
          std::int32_t acc = 1 << (ResampleAxis::kPrecisionBits - 1);
          for (int x = 0; x < n; ++x) acc += s[(x0 + x) * cn + c] * k[x];
          d[xx * cn + c] = ResampleAxis::clip8(acc);
        }
      }
    }
    cur = tmp;
  }
  if (out_h != in.rows) {
    const ResampleAxis ax(in.rows, out_h, filter);
    cv::Mat tmp(out_h, cur.cols, in.type());
    const int row = cur.cols * cn;
    for (int yy = 0; yy < out_h; ++yy) {
      const std::int32_t* k = &ax.weights[static_cast<std::size_t>(yy * ax.ksize)];
      const int y0 = ax.first[static_cast<std::size_t>(yy)], n = ax.count[static_cast<std::size_t>(yy)];
      std::uint8_t* d = tmp.ptr<std::uint8_t>(yy);
      for (int i = 0; i < row; ++i) {
        std::int32_t acc = 1 << (ResampleAxis::kPrecisionBits - 1);
        for (int y = 0; y < n; ++y) acc += cur.ptr<std::uint8_t>(y0 + y)[i] * k[y];
        d[i] = ResampleAxis::clip8(acc);
      }
    }
    cur = tmp;
  }
  return cur;
}

inline std::string size_text(const cv::Mat& m) { return std::to_string(m.rows) + "x" + std::to_string(m.cols); }

// The image format a file's first bytes announce ("" for none): a file that announces one and
// does not decode is damaged, not misnamed.
inline std::string image_signature(const std::vector<std::uint8_t>& b) {
  const auto starts = [&](std::initializer_list<int> sig) {
    if (b.size() < sig.size()) return false;
    std::size_t i = 0;
    for (int v : sig) {
      if (v >= 0 && b[i] != v) return false;  // -1: any byte
      ++i;
    }
    return true;
  };
  if (starts({0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a})) return "PNG";
  if (starts({0xff, 0xd8, 0xff})) return "JPEG";
  if (starts({'B', 'M'})) return "BMP";
  if (starts({'R', 'I', 'F', 'F', -1, -1, -1, -1, 'W', 'E', 'B', 'P'})) return "WebP";
  if (starts({'I', 'I', 42, 0}) || starts({'M', 'M', 0, 42})) return "TIFF";
  return "";
}

// A 16-bit image as PIL reads it into 8 bits: grey (PIL's mode "I") converts by clipping to
// 0..255; grey+alpha, RGB and RGBA (PIL's rawmodes "LA;16B", "RGB;16B", "RGBA;16B") keep each
// sample's high byte.
inline cv::Mat pil_8_bits(const cv::Mat& wide) {
  cv::Mat out(wide.rows, wide.cols, CV_MAKETYPE(CV_8U, wide.channels()));
  const int n = wide.cols * wide.channels();
  for (int y = 0; y < wide.rows; ++y) {
    const auto* s = wide.ptr<std::uint16_t>(y);
    auto* d = out.ptr<std::uint8_t>(y);
    for (int x = 0; x < n; ++x)
      d[x] = wide.channels() == 1 ? static_cast<std::uint8_t>(std::min<unsigned>(s[x], 255u)) : static_cast<std::uint8_t>(s[x] >> 8);
  }
  return out;
}
}  // namespace detail

/// The 8-bit image in the file at `path` with 1 channel (PIL's convert("L")) or 3 (convert("RGB")).
/// Any format OpenCV's imgcodecs reads (PNG, JPEG, BMP, PPM/PGM, TIFF, WebP); EXIF orientation is
/// not applied (PIL does not either). 16-bit images come to 8 bits as PIL's do (16-bit grey
/// clipped to 0..255, the other kinds' high bytes). DataError naming the file when it cannot be
/// read, is not an image OpenCV decodes (a damaged one named so), or has another sample type.
inline cv::Mat decode_image(const std::string& path, int channels) {
  if (channels != 1 && channels != 3)
    throw ConfigError("decode_image: channels must be 1 (grey) or 3 (RGB), got " + std::to_string(channels));
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw DataError(path + ": cannot be read (" + std::strerror(errno) + ")");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(in.tellg()));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size())))
    throw DataError(path + ": cannot be read (" + std::strerror(errno) + ")");
  cv::Mat raw;
  std::string opencv_says;
  try {
    if (!bytes.empty()) raw = cv::imdecode(bytes, cv::IMREAD_UNCHANGED);
  } catch (const cv::Exception& e) {
    opencv_says = std::string(", OpenCV: ") + e.what();
  }
  if (raw.empty()) {
    const auto format = detail::image_signature(bytes);
    if (!format.empty())
      throw DataError(path + ": a " + format + " file OpenCV cannot decode (" + std::to_string(bytes.size()) + " bytes" +
                      opencv_says + "): truncated or damaged; copy it again from its source, or remove it from the folder");
    throw DataError(path + ": not an image (" + std::to_string(bytes.size()) + " bytes, no image format's signature" +
                    opencv_says + "); remove it from the folder");
  }
  if (raw.depth() == CV_16U) raw = detail::pil_8_bits(raw);
  if (raw.depth() != CV_8U)
    throw DataError(path + ": an image of " + std::to_string(8 * raw.elemSize1()) + "-bit " +
                    (raw.depth() == CV_32F || raw.depth() == CV_64F ? "floating-point" : "integer") +
                    " samples; 8- and 16-bit images are read (convert it first)");
  return detail::pil_convert(raw, channels, path);
}

/// @name Image stages for data::map (each takes and returns a data::Image)
/// @{

/// transforms.Resize((height, width)) on a PIL image, bilinear: PIL's filter, pixel for pixel.
/// `resize(size)` alone matches the smaller edge to `size`, the other edge scaled and truncated
/// as torchvision computes it.
struct resize {
  int height = 0, width = 0;
  explicit resize(int size) : height(size), width(0) { check(); }
  resize(int h, int w) : height(h), width(w) { check(); }
  Image operator()(Image im) const {
    int h = height, w = width;
    if (w == 0) {  // the smaller edge becomes `height`
      const int rows = im.pixels.rows, cols = im.pixels.cols;
      if (rows <= cols) w = static_cast<int>(static_cast<double>(height) * cols / rows);
      else h = static_cast<int>(static_cast<double>(height) * rows / cols), w = height;
    }
    if (h != im.pixels.rows || w != im.pixels.cols) im.pixels = detail::pil_resize(im.pixels, h, w, detail::Resample::bilinear);
    return im;
  }

 private:
  void check() const {
    if (height < 1 || width < 0)
      throw ConfigError("resize: sizes must be positive, got " + std::to_string(height) + "x" + std::to_string(width));
  }
};

/// transforms.CenterCrop((height, width)): the offsets rounded as Python's round() does (half to
/// even). An image smaller than the crop is a DataError naming the file (resize it first).
struct center_crop {
  int height, width;
  Image operator()(Image im) const {
    const int dy = im.pixels.rows - height, dx = im.pixels.cols - width;
    if (dy < 0 || dx < 0)
      throw DataError(im.path + ": center_crop(" + std::to_string(height) + ", " + std::to_string(width) + ") of a " +
                      detail::size_text(im.pixels) + " image; resize before cropping");
    auto half_even = [](int d) { return d % 2 == 0 || (d / 2) % 2 == 0 ? d / 2 : d / 2 + 1; };
    im.pixels = im.pixels(cv::Rect(half_even(dx), half_even(dy), width, height));
    return im;
  }
};

/// transforms.RandomCrop((height, width), padding): `padding` zero pixels on every side, then a
/// crop at an offset drawn from the sample's generator.
struct random_crop {
  int height, width, padding = 0;
  Image operator()(Image im, at::Generator& g) const {
    if (padding > 0) {
      cv::Mat padded;
      cv::copyMakeBorder(im.pixels, padded, padding, padding, padding, padding, cv::BORDER_CONSTANT, cv::Scalar::all(0));
      im.pixels = padded;
    }
    const int dy = im.pixels.rows - height, dx = im.pixels.cols - width;
    if (dy < 0 || dx < 0)
      throw DataError(im.path + ": random_crop(" + std::to_string(height) + ", " + std::to_string(width) + ") of a " +
                      detail::size_text(im.pixels) + " image (padding included); resize before cropping");
    const int top = detail::uniform_int(g, dy), left = detail::uniform_int(g, dx);
    im.pixels = im.pixels(cv::Rect(left, top, width, height));
    return im;
  }
};

/// transforms.RandomHorizontalFlip(p): mirrored left to right with probability p.
struct random_horizontal_flip {
  double p = 0.5;
  Image operator()(Image im, at::Generator& g) const {
    if (detail::uniform(g) < p) {
      cv::Mat flipped;
      cv::flip(im.pixels, flipped, 1);
      im.pixels = flipped;
    }
    return im;
  }
};
/// @}

/// The collate stage for images: ToTensor + Normalize(mean, std) of every image into one batch,
/// Fields {"image": float32 [B, C, H, W], "label": int64 [B]}. `mean` and `std` hold one value per
/// channel, or one for all. The images of a batch must have one size (crop or resize them).
struct stack_images {
  std::vector<float> mean{0.0f}, std{1.0f};

  Fields operator()(const std::vector<Image>& images) const {
    if (images.empty()) return Fields{{"image", torch::empty({0})}, {"label", torch::empty({0}, torch::kInt64)}};
    const cv::Mat& first = images.front().pixels;
    const int c = first.channels(), h = first.rows, w = first.cols;
    check(c);
    auto out = torch::empty({static_cast<std::int64_t>(images.size()), c, h, w}, torch::kFloat32);
    auto labels = torch::empty({static_cast<std::int64_t>(images.size())}, torch::kInt64);
    float* o = out.data_ptr<float>();
    for (std::size_t i = 0; i < images.size(); ++i) {
      const cv::Mat& m = images[i].pixels;
      if (m.channels() != c || m.rows != h || m.cols != w)
        throw DataError(images[i].path + ": a " + detail::size_text(m) + "x" + std::to_string(m.channels()) +
                        " image in a batch of " + std::to_string(h) + "x" + std::to_string(w) + "x" + std::to_string(c) +
                        " ones; resize or crop the images to one size before stack_images");
      for (int ch = 0; ch < c; ++ch) {
        const float mu = mean[mean.size() == 1 ? 0 : static_cast<std::size_t>(ch)];
        const float sd = std[std.size() == 1 ? 0 : static_cast<std::size_t>(ch)];
        for (int y = 0; y < h; ++y) {
          const std::uint8_t* s = m.ptr<std::uint8_t>(y) + ch;
          for (int x = 0; x < w; ++x) *o++ = (static_cast<float>(s[x * c]) / 255.0f - mu) / sd;
        }
      }
      labels.data_ptr<std::int64_t>()[i] = images[i].label;
    }
    return Fields{{"image", out}, {"label", labels}};
  }

  /// ConfigError unless mean and std fit `channels`-channel images and every std is positive.
  void check(int channels) const {
    auto fits = [&](const std::vector<float>& v) { return v.size() == 1 || v.size() == static_cast<std::size_t>(channels); };
    if (!fits(mean) || !fits(std))
      throw ConfigError("stack_images: mean and std need 1 or " + std::to_string(channels) + " values for " +
                        std::to_string(channels) + "-channel images, got " + std::to_string(mean.size()) + " and " +
                        std::to_string(std.size()));
    for (float s : std)
      if (!(s > 0)) throw ConfigError("stack_images: every std must be positive, got " + std::to_string(s));
  }
};

}  // namespace data

DTRAIN_NAMESPACE_END
