// SPDX-License-Identifier: Apache-2.0
#pragma once
// All of dtrain that needs no optional library: every area's umbrella. A program that uses one
// area parses less with that area's umbrella (dtrain.hpp lists them). The image headers need
// OpenCV (the dtrain::images target) and are included by name.

#include <dtrain/data.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/inference.hpp>
#include <dtrain/models.hpp>
#include <dtrain/tune.hpp>
#include <dtrain/weights.hpp>
