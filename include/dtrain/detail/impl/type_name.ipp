// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of type_name.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <cxxabi.h>

#include <cstdlib>

#include <dtrain/detail/type_name.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {

DTRAIN_INLINE std::string demangle(const char* mangled) {
  int status = 0;
  char* name = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : mangled;
  std::free(name);
  return out;
}

}  // namespace detail
DTRAIN_NAMESPACE_END
