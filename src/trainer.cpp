// SPDX-License-Identifier: Apache-2.0
// dtrain's library (DTRAIN_SEPARATE_COMPILATION): the Trainer's driver and a worker's life around
// its train loop, compiled once.
// Each impl/*.ipp holds the bodies its header declares; src/ includes each exactly once
// (tests/compile/check_sources.py).
#ifndef DTRAIN_SEPARATE_COMPILATION
#error "src/*.cpp build dtrain's library: compile them with DTRAIN_SEPARATE_COMPILATION defined (CMake: -DDTRAIN_SEPARATE_COMPILATION=ON)"
#endif

#include <dtrain/trainer/impl/driver.ipp>
