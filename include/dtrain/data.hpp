// SPDX-License-Identifier: Apache-2.0
#pragma once
// dtrain's data umbrella (docs/data.md): batches of named fields, CSV and JSON Lines sources read
// by index, text files, pipelines on loader threads, preprocessors saved with checkpoints, splits,
// and the tokenizers (WordPiece, byte-level BPE, SentencePiece, word vocabularies). The image
// headers need OpenCV (the dtrain::images target) and are included by name:
// <dtrain/data/image.hpp>, <dtrain/data/image_folder.hpp>, <dtrain/data/image_transforms.hpp>,
// <dtrain/data/vit_image_processor.hpp>.

#include <dtrain/data/bpe_tokenizer.hpp>
#include <dtrain/data/causal_lm.hpp>
#include <dtrain/data/collate.hpp>
#include <dtrain/data/csv.hpp>
#include <dtrain/data/csv_table.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/fashion_mnist.hpp>
#include <dtrain/data/fields.hpp>
#include <dtrain/data/files.hpp>
#include <dtrain/data/idx.hpp>
#include <dtrain/data/idx_cache.hpp>
#include <dtrain/data/jsonl.hpp>
#include <dtrain/data/loader.hpp>
#include <dtrain/data/pipeline.hpp>
#include <dtrain/data/prefetch.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/data/row.hpp>
#include <dtrain/data/sentencepiece.hpp>
#include <dtrain/data/shard.hpp>
#include <dtrain/data/splits.hpp>
#include <dtrain/data/stateful_stage.hpp>
#include <dtrain/data/text_file.hpp>
#include <dtrain/data/token_ids.hpp>
#include <dtrain/data/wordpiece.hpp>
