// SPDX-License-Identifier: Apache-2.0
// scripts/check-cuda runs this on a machine without a GPU: NVRTC compiles nn::cross_entropy_fp32's
// CUDA kernels (fp16 and bf16) for every architecture it knows from Volta's successors on, as the
// loss does on a GPU at its first call. A kernel that does not compile fails here, not there.
//   nvrtc_kernels                      compile them
//   nvrtc_kernels --write-source FILE  write their source, for tests/cuda/kernels_on_cpu.cpp
#include <cstdio>
#include <cstring>
#include <fstream>
#include <exception>
#include <vector>

#include <dtrain/nn/detail/cross_entropy_kernels.hpp>

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--write-source") == 0) {
    std::ofstream out(argv[2]);
    out << dtrain::nn::detail::cross_entropy_kernel_source;
    return out ? 0 : 1;
  }
  int count = 0;
  if (nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS) return 1;
  std::vector<int> archs(static_cast<std::size_t>(count));
  if (nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) return 1;
  int failed = 0, compiled = 0;
  for (int arch : archs) {
    if (arch < 75) continue;
    for (bool bf16 : {false, true}) {
      try {
        const auto code = dtrain::nn::detail::compile_cross_entropy_kernels(arch / 10, arch % 10, bf16);
        std::printf("sm_%d %s: %zu bytes of cubin\n", arch, bf16 ? "bf16" : "fp16", code.size());
        ++compiled;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "sm_%d %s: %s\n", arch, bf16 ? "bf16" : "fp16", e.what());
        ++failed;
      }
    }
  }
  // A device newer than NVRTC knows gets PTX of the newest architecture it knows.
  try {
    const auto ptx = dtrain::nn::detail::compile_cross_entropy_kernels(99, 9, true);
    std::printf("sm_999 bf16: %zu bytes of PTX\n", ptx.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "PTX for a newer device: %s\n", e.what());
    ++failed;
  }
  std::printf("%d compiled, %d failed\n", compiled, failed);
  return failed == 0 && compiled > 0 ? 0 : 1;
}
