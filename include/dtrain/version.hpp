// SPDX-License-Identifier: Apache-2.0
#pragma once
// dtrain's version, and the inline namespace that keeps two versions apart in one binary.

#define DTRAIN_VERSION_MAJOR 0
#define DTRAIN_VERSION_MINOR 1
#define DTRAIN_VERSION_PATCH 0

// Every public name lives in dtrain::v0 and is reached as dtrain::name: a binary that links two
// libraries built against different major versions gets distinct symbols instead of an ODR break.
#define DTRAIN_NAMESPACE_BEGIN namespace dtrain { inline namespace v0 {
#define DTRAIN_NAMESPACE_END } }

// How the bodies of dtrain's non-template functions reach a program (docs/packaging.md). By
// default they are inline, in the `impl/*.ipp` file each header includes at its end: header-only.
// With DTRAIN_SEPARATE_COMPILATION defined (CMake's -DDTRAIN_SEPARATE_COMPILATION=ON defines it on
// the target dtrain::dtrain) the headers hold declarations and templates only, and src/*.cpp
// compile the bodies once into dtrain's library, which the program links.
#ifdef DTRAIN_SEPARATE_COMPILATION
#define DTRAIN_INLINE
#else
#define DTRAIN_INLINE inline
#endif
