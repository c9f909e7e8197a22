// Byte-level BPE training (GPT-2 style), producing a tokenizer.json that Hugging Face and
// Tokenizer::FromJson load.
//
// Documents are split at literal occurrences of the special tokens, pre-tokenized with `pattern`,
// and every piece is spelled in the 256-character byte-level alphabet, so any byte string is
// encodable and decodes back exactly. Merges are learned greedily: the most frequent adjacent pair
// wins, ties go to the pair of smaller ids, so training is deterministic.
//
// Ids: the special tokens first (0..n-1, as special added tokens), then the 256 byte characters in
// byte order (byte b is id n + b), then one id per merge in the order learned.
//
// Output layout: pre_tokenizer Sequence[Split(pattern, Isolated), ByteLevel(use_regex=false)],
// decoder ByteLevel, post_processor ByteLevel, model BPE with merges as "left right" strings.
#pragma once

#include <string>
#include <vector>

#include "common/tokenizer/pre_tokenizer.h"
#include "common/util/status.h"

namespace specula {

struct BpeTrainerOptions {
  // Final vocabulary size including special tokens; training stops earlier if no pair occurs at
  // least `min_frequency` times.
  int vocab_size = 8192;
  int min_frequency = 2;
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
  // Llama-3's split suits code: "_name" and ".attr" stay whole, indentation is its own piece.
  std::string pattern = std::string(kLlama3SplitPattern);
  // Progress lines on stderr (word counting, every 1000 merges).
  bool show_progress = true;
};

// Returns the tokenizer.json text. INVALID_ARGUMENT for a vocab_size below 256 + the number of
// special tokens, an empty, duplicate or ill-formed UTF-8 special token, or a pattern that does
// not compile.
StatusOr<std::string> TrainByteLevelBpe(const std::vector<std::string>& documents,
                                        const BpeTrainerOptions& options);

}  // namespace specula
