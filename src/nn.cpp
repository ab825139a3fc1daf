// SPDX-License-Identifier: Apache-2.0
// dtrain's library (DTRAIN_SEPARATE_COMPILATION): the model families (ResNet, BERT, ViT, Llama, GPT-2), generation and their layers, compiled once.
// Each impl/*.ipp holds the bodies its header declares; src/ includes each exactly once
// (tests/compile/check_sources.py).
#ifndef DTRAIN_SEPARATE_COMPILATION
#error "src/*.cpp build dtrain's library: compile them with DTRAIN_SEPARATE_COMPILATION defined (CMake: -DDTRAIN_SEPARATE_COMPILATION=ON)"
#endif

#include <dtrain/nn/impl/batchnorm.ipp>
#include <dtrain/nn/impl/bert.ipp>
#include <dtrain/nn/impl/bert_config.ipp>
#include <dtrain/nn/impl/clip.ipp>
#include <dtrain/nn/impl/clip_config.ipp>
#include <dtrain/nn/impl/decoder.ipp>
#include <dtrain/nn/impl/encoder.ipp>
#include <dtrain/nn/impl/generate.ipp>
#include <dtrain/nn/impl/gpt2.ipp>
#include <dtrain/nn/impl/hub_config.ipp>
#include <dtrain/nn/impl/llama.ipp>
#include <dtrain/nn/impl/llama_config.ipp>
#include <dtrain/nn/impl/lora.ipp>
#include <dtrain/nn/impl/loss.ipp>
#include <dtrain/nn/impl/packed.ipp>
#include <dtrain/nn/impl/peft.ipp>
#include <dtrain/nn/impl/pretrained.ipp>
#include <dtrain/nn/impl/recompute.ipp>
#include <dtrain/nn/impl/resnet.ipp>
#include <dtrain/nn/impl/vit.ipp>
#include <dtrain/nn/impl/vit_config.ipp>
