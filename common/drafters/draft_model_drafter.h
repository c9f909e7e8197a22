// The classic standalone draft model: a small LM with the target's tokenizer, with its own paged KV
// cache of each sequence's tokens, proposes a chain autoregressively (one batched forward per
// depth for all sequences) or a top-k tree.
//
// Greedy requests get argmax candidates. Sampled requests get candidates sampled from the draft
// model's distribution shaped by the request's temperature/top-k/top-p, with that distribution
// attached for the lossless rejection verifier (chains), or deterministic top-k children (trees).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/drafters/confidence_calibration.h"
#include "common/drafters/draft_vocab.h"
#include "common/model/model_runner.h"
#include "common/spec/drafter.h"

namespace specula {

struct DraftModelDrafterOptions {
  // 1: a chain. w > 1: a tree; at each depth the w best frontier nodes (by path probability) are
  // expanded into their top-w children, and the best nodes are kept until the budget is used.
  int32_t tree_width = 1;
  // The draft LM ranks only these tokens (its head reads N of its V rows; at batch 1 on a CPU the
  // tied head is most of a small LM's weights). Null = the whole vocabulary.
  std::shared_ptr<const DraftVocab> draft_vocab;
  // The most recent tokens of a sequence the draft LM reads when it (re)starts it: a sequence
  // whose cache is further behind than this (a new prompt, or one not drafted for a while) starts
  // over from its last `context` tokens instead of catching up on all of them. 0 = every token
  // that fits the draft LM's position limit. Either way a sequence longer than that limit starts
  // over from its last min(context, limit / 2) tokens when it outgrows it, so a draft LM with a
  // shorter context than the target's still drafts for long sequences. Lossless whatever the
  // value (the target verifies); a smaller one trades acceptance for cheaper catch-ups.
  int64_t context = 0;
};

class DraftModelDrafter : public Drafter {
 public:
  // INVALID_ARGUMENT if the draft model's vocabulary differs from target_vocab_size.
  static StatusOr<std::unique_ptr<DraftModelDrafter>> Create(std::unique_ptr<ModelRunner> model,
                                                             int32_t target_vocab_size,
                                                             DraftModelDrafterOptions options = {});
  ~DraftModelDrafter() override;

  std::string name() const override { return "draft-model"; }
  Status AddSequence(SeqId seq, const SamplingParams& sampling) override;
  void ReleaseSequence(SeqId seq) override;
  Status Observe(const std::vector<DrafterObservation>& observations) override;
  StatusOr<std::vector<CandidateTree>> Propose(const std::vector<DraftRequest>& requests) override;
  // Bytes of the draft LM's KV blocks in use.
  int64_t StateBytes() const override { return model_->kv_stats().bytes_in_use(); }

  const ModelRunner& model() const { return *model_; }

 private:
  struct State;
  DraftModelDrafter(std::unique_ptr<ModelRunner> model, DraftModelDrafterOptions options);

  std::unique_ptr<ModelRunner> model_;
  DraftModelDrafterOptions options_;
  std::unordered_map<SeqId, std::unique_ptr<State>> states_;
  // How often its chain nodes are accepted by the probability it gave them: greedy requests', then
  // sampled ones' (accepted with probability min(1, p/q)).
  std::array<ConfidenceCalibration, 2> calibration_;
};

}  // namespace specula
