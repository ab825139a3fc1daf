// SPDX-License-Identifier: Apache-2.0
#pragma once
// One concept per policy category, one header each under dtrain/concept/ (what a policy of that
// category must provide, its optional members with their defaults, its laws and models).
// policy::set checks the resolved policies against them, so a policy of your own that lacks a
// piece is rejected with a message naming the category, not deep inside the Trainer.

#include <dtrain/concept/backend.hpp>
#include <dtrain/concept/checkpointer.hpp>
#include <dtrain/concept/precision.hpp>
#include <dtrain/concept/sampler.hpp>
#include <dtrain/concept/strategy.hpp>
#include <dtrain/concept/tracker.hpp>
