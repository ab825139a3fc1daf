// SPDX-License-Identifier: Apache-2.0
// dtrain's library (DTRAIN_SEPARATE_COMPILATION): datasets, pipelines, preprocessors and tokenizers, compiled once.
// Each impl/*.ipp holds the bodies its header declares; src/ includes each exactly once
// (tests/compile/check_sources.py).
#ifndef DTRAIN_SEPARATE_COMPILATION
#error "src/*.cpp build dtrain's library: compile them with DTRAIN_SEPARATE_COMPILATION defined (CMake: -DDTRAIN_SEPARATE_COMPILATION=ON)"
#endif

#include <dtrain/data/detail/impl/bert_text.ipp>
#include <dtrain/data/detail/impl/bpe_file.ipp>
#include <dtrain/data/detail/impl/bpe_model.ipp>
#include <dtrain/data/detail/impl/bpe_stages.ipp>
#include <dtrain/data/detail/impl/bpe_text.ipp>
#include <dtrain/data/detail/impl/regex.ipp>
#include <dtrain/data/detail/impl/wordpiece_impl.ipp>
#include <dtrain/data/impl/bpe_tokenizer.ipp>
#include <dtrain/data/impl/causal_lm.ipp>
#include <dtrain/data/impl/collate.ipp>
#include <dtrain/data/impl/csv.ipp>
#include <dtrain/data/impl/csv_table.ipp>
#include <dtrain/data/impl/dataset.ipp>
#include <dtrain/data/impl/fashion_mnist.ipp>
#include <dtrain/data/impl/fields.ipp>
#include <dtrain/data/impl/files.ipp>
#include <dtrain/data/impl/idx.ipp>
#include <dtrain/data/impl/idx_cache.ipp>
#include <dtrain/data/impl/jsonl.ipp>
#include <dtrain/data/impl/pipeline.ipp>
#include <dtrain/data/impl/preprocess.ipp>
#include <dtrain/data/impl/row.ipp>
#include <dtrain/data/impl/sentencepiece.ipp>
#include <dtrain/data/impl/splits.ipp>
#include <dtrain/data/impl/stateful_stage.ipp>
#include <dtrain/data/impl/text_file.ipp>
#include <dtrain/data/impl/token_ids.ipp>
#include <dtrain/data/impl/wordpiece.ipp>
