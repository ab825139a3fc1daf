// SPDX-License-Identifier: Apache-2.0
#pragma once
// A C++ type's name as a person reads it: params.json's policies, model_config.json's model.

#include <string>
#include <typeinfo>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

/// `mangled` (a typeid's name) as the compiler's ABI demangles it; as it is when it cannot.
std::string demangle(const char* mangled);

/// T's name as the compiler's ABI demangles it ("NetImpl", "ns::NetImpl").
template <class T>
std::string type_name() {
  return demangle(typeid(T).name());
}

}  // namespace detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/detail/impl/type_name.ipp>
#endif
