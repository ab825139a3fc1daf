// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of cross_entropy_kernels.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/detail/cross_entropy_kernels.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {
namespace detail {

DTRAIN_INLINE std::vector<char> compile_cross_entropy_kernels(int major, int minor, bool bf16) {
  auto check = [](nvrtcResult r, const char* what) {
    if (r != NVRTC_SUCCESS) throw std::runtime_error(std::string(what) + ": " + nvrtcGetErrorString(r));
  };
  int count = 0;
  check(nvrtcGetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<std::size_t>(count));
  check(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  const int wanted = 10 * major + minor;
  int arch = 0;
  for (int a : archs)
    if (a <= wanted && a > arch) arch = a;
  if (arch == 0)
    throw std::runtime_error("NVRTC " + std::to_string(count) + " architectures, none at or below sm_" +
                             std::to_string(wanted));
  const bool cubin = arch == wanted;
  const std::string arch_option = std::string("--gpu-architecture=") + (cubin ? "sm_" : "compute_") +
                                  std::to_string(arch);
  std::vector<const char*> options = {arch_option.c_str(), "--std=c++17"};
  if (bf16) options.push_back("-DDTRAIN_BF16");

  nvrtcProgram program = nullptr;
  check(nvrtcCreateProgram(&program, cross_entropy_kernel_source, "dtrain_cross_entropy.cu", 0, nullptr, nullptr),
        "nvrtcCreateProgram");
  struct destroy {
    nvrtcProgram* p;
    ~destroy() { nvrtcDestroyProgram(p); }
  } destroy_program{&program};
  if (nvrtcCompileProgram(program, static_cast<int>(options.size()), options.data()) != NVRTC_SUCCESS) {
    std::size_t size = 0;
    nvrtcGetProgramLogSize(program, &size);
    std::string log(size, '\0');
    nvrtcGetProgramLog(program, log.data());
    throw std::runtime_error("NVRTC could not compile the cross-entropy kernels for " + arch_option + ":\n" + log);
  }
  std::size_t size = 0;
  std::vector<char> code;
  if (cubin) {
    check(nvrtcGetCUBINSize(program, &size), "nvrtcGetCUBINSize");
    code.resize(size);
    check(nvrtcGetCUBIN(program, code.data()), "nvrtcGetCUBIN");
  } else {
    check(nvrtcGetPTXSize(program, &size), "nvrtcGetPTXSize");
    code.resize(size);
    check(nvrtcGetPTX(program, code.data()), "nvrtcGetPTX");
  }
  return code;
}
}  // namespace detail
}  // namespace nn
DTRAIN_NAMESPACE_END
