// SPDX-License-Identifier: Apache-2.0
#pragma once
// dtrain's model umbrella (docs/models.md): the model families with the published checkpoints'
// names (BERT, ViT, CLIP, ResNet; the decoders Llama, Mistral, Qwen2 and GPT-2 with generation; LoRA adapters PEFT loads) and their layers, the models a checkpoint describes
// (checkpointer/model_config.hpp), and the weights files (safetensors, sharded indexes, torch.save
// pickles).

#include <dtrain/checkpointer/model_config.hpp>
#include <dtrain/nn/bert.hpp>
#include <dtrain/nn/bert_export.hpp>
#include <dtrain/nn/clip.hpp>
#include <dtrain/nn/clip_config.hpp>
#include <dtrain/nn/decoder.hpp>
#include <dtrain/nn/encoder.hpp>
#include <dtrain/nn/generate.hpp>
#include <dtrain/nn/gpt2.hpp>
#include <dtrain/nn/llama.hpp>
#include <dtrain/nn/llama_config.hpp>
#include <dtrain/nn/lora.hpp>
#include <dtrain/nn/lora_checkpoint.hpp>
#include <dtrain/nn/loss.hpp>
#include <dtrain/nn/packed.hpp>
#include <dtrain/nn/peft.hpp>
#include <dtrain/nn/recompute.hpp>
#include <dtrain/nn/resnet.hpp>
#include <dtrain/nn/vit.hpp>
#include <dtrain/weights.hpp>
