// Pre-tokenizers: split normalized text into the pieces ("words") that BPE encodes one at a time.
//
// Supported tokenizer.json types: ByteLevel (GPT-2 regex split + byte-to-unicode mapping), Split
// (String or Regex pattern, all five delimiter behaviours, invert), Metaspace (SentencePiece "▁"),
// Digits and Sequence. This covers GPT-2, Llama-2, Llama-3, Qwen2/3 and Mistral tokenizers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/util/status.h"

namespace specula {

// GPT-2's split (what ByteLevel use_regex=true applies).
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama-3's split: case-insensitive contractions, a leading non-letter glued to words ("_name",
// ".append"), numbers in groups of up to three digits, newline runs kept apart from indentation.
inline constexpr std::string_view kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreToken {
  std::string text;
  // True if the piece starts at offset 0 of the text passed to Encode (Metaspace's "first" scheme).
  bool at_start = false;
};

// What happens to pattern matches when a piece is split (Hugging Face SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits a text of `text_size` bytes at `matches` (sorted, non-overlapping [begin, end) ranges)
// and appends the resulting non-empty ranges. `invert` swaps which parts count as matches.
void SplitByMatches(size_t text_size, const std::vector<std::pair<size_t, size_t>>& matches,
                    SplitBehavior behavior, bool invert,
                    std::vector<std::pair<size_t, size_t>>* pieces);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every token by the pieces it splits into (transformed, for ByteLevel and Metaspace).
  virtual void PreTokenize(std::vector<PreToken>* tokens) const = 0;
};

// Parses the "pre_tokenizer" field; JSON null gives nullptr (each text run is one piece).
StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& json,
                                                          std::string_view path);

}  // namespace specula
