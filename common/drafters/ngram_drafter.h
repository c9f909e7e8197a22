// Prompt lookup / n-gram drafting (no weights): find the most recent earlier occurrence of the
// sequence's last n tokens (n from max_ngram down to min_ngram) and propose the tokens that
// followed it, as a deterministic chain. When those run out at the last token (the text repeats
// with period H - start, e.g. a loop in the output) and the match is long, the chain repeats the
// period.
// Per-sequence hash indexes of every n-gram's latest end position make each proposal O(max_ngram -
// min_ngram + draft length), whatever the context length.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/drafters/ngram_calibration.h"
#include "common/spec/drafter.h"
#include "common/util/status.h"

namespace specula {

struct NgramDrafterOptions {
  // 1 <= min_ngram <= max_ngram <= NgramDrafter::kMaxNgram.
  int32_t min_ngram = 1;
  int32_t max_ngram = 4;
  // The target's vocabulary: Observe refuses tokens outside [0, vocab_size). 0 = unchecked.
  int64_t vocab_size = 0;
  // A continuation that reaches the last token is repeated past it when the match behind it
  // (the suffix that occurred one period earlier) is at least this many tokens long; 0 = never.
  // On the bundled model at batch 1, 10% of fixed k = 8 drafts were cut short there: with a
  // match of 8+ tokens 97% of them were accepted whole, with 1-4 tokens 25-53%.
  int32_t repeat_min_match = 8;
};

class NgramDrafter : public Drafter {
 public:
  static constexpr int32_t kMaxNgram = 32;

  // INVALID_ARGUMENT naming the field when the options are out of range.
  static StatusOr<std::unique_ptr<NgramDrafter>> Create(NgramDrafterOptions options = {});
  // Does not validate: with out-of-range options the drafter never proposes anything (use Create
  // to get the error instead).
  explicit NgramDrafter(NgramDrafterOptions options = {});
  ~NgramDrafter() override;

  std::string name() const override { return "ngram"; }
  Status AddSequence(SeqId seq, const SamplingParams& sampling) override;
  void ReleaseSequence(SeqId seq) override;
  Status Observe(const std::vector<DrafterObservation>& observations) override;
  StatusOr<std::vector<CandidateTree>> Propose(const std::vector<DraftRequest>& requests) override;

 private:
  struct State;
  NgramDrafterOptions options_;
  std::unordered_map<SeqId, std::unique_ptr<State>> states_;
  // Acceptance by match length, greedy [0] and sampled [1] sequences apart (ngram_calibration.h).
  std::array<NgramCalibration, 2> calibration_;
};

}  // namespace specula
