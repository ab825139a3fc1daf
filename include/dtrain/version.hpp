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
