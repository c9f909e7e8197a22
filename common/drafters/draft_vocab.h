// A draft vocabulary: the tokens the target actually emits, most frequent first, for the drafters
// that project onto the target's lm_head (SpecFormer, Beagle, ParallelSpec). Their head then
// multiplies only these N rows instead of all V (FR-Spec's frequency-ranked draft head, EAGLE-3's
// reduced draft vocabulary): at batch 1 on a CPU, reading the V x d head is most of a draft call.
// Lossless: a token outside the set is never drafted (the target still decides every token), and
// a sampled proposal is zero outside it, which rejection sampling handles. Torch-free.
//
// draft_vocab.json (written by `specula draft-vocab`):
//   {"vocab_size": 4096, "tokens": [17, 4, ...], "coverage": 0.995,
//    "source": "data/distill.bin", "counted_tokens": 4068968}
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/status.h"

namespace specula {

struct DraftVocab {
  int64_t vocab_size = 0;       // the target vocabulary the ids index
  std::vector<int32_t> tokens;  // the set, most frequent first
  double coverage = 0;          // share of the counted tokens inside the set (informational)
  std::string source;           // what was counted (informational)
  int64_t counted_tokens = 0;

  // The `size` most frequent tokens of `counts` (index = token id; ties: lower id first); tokens
  // never counted are left out, so the set can be smaller than `size`.
  static DraftVocab FromCounts(const std::vector<int64_t>& counts, int64_t size,
                               std::string source);
  static StatusOr<DraftVocab> FromJson(std::string_view text, std::string_view src);
  // NOT_FOUND for a missing file; FromJson's errors otherwise.
  static StatusOr<DraftVocab> FromFile(const std::string& path);
  std::string ToJson() const;

  // INVALID_ARGUMENT naming `src`: an empty set, an id outside [0, vocab_size), a repeated id.
  Status Validate(std::string_view src) const;
  // INVALID_ARGUMENT when the set was made for another vocabulary size than `target_vocab`.
  Status CheckTarget(int64_t target_vocab, std::string_view src) const;
};

}  // namespace specula
