// SPDX-License-Identifier: Apache-2.0
#pragma once
// Catch2 for tests that also include LibTorch. Debian's LibTorch includes glog, whose CHECK macro
// would silently replace Catch's (a failing check then aborts instead of being reported, and a
// passing one is not counted). Include glog first, drop its CHECK, then let Catch define its own.
#include <c10/util/Logging.h>
#undef CHECK
#include <catch2/catch.hpp>
