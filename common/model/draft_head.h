// An lm_head as a drafter's output projection, optionally cut to a draft vocabulary
// (common/drafters/draft_vocab.h): SpecFormer, Beagle and ParallelSpec project with the target's;
// a standalone draft LM with its own (ModelRunner::RestrictVocabulary). Include only from .cc
// files: this header pulls in <torch/torch.h>.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace specula {

class DraftHead {
 public:
  // The lm_head weight [V, d]: shared (not copied), frozen. Clears a restriction.
  void Set(const torch::Tensor& lm_head_weight);
  // Projects onto `tokens` only (ids in [0, V), no repeats): copies those rows of the head, on the
  // head's device and dtype. Serving only: training always uses the full head.
  void Restrict(const std::vector<int32_t>& tokens);

  bool defined() const { return full_.defined(); }
  bool restricted() const { return rows_.defined(); }
  // Tokens a projection can rank: V, or the draft vocabulary's size.
  int64_t size() const { return restricted() ? rows_.size(0) : full_.size(0); }
  // x [..., d] -> logits [..., V]; restricted: -inf outside the draft vocabulary.
  torch::Tensor operator()(const torch::Tensor& x) const;
  // The whole head [V, d]; restricted: the draft vocabulary's rows [N, d] and their ids [N]
  // (int64).
  const torch::Tensor& full_weight() const { return full_; }
  const torch::Tensor& restricted_rows() const { return rows_; }
  const torch::Tensor& restricted_ids() const { return ids_; }

 private:
  torch::Tensor full_;  // [V, d]
  torch::Tensor rows_;  // [N, d] the draft vocabulary's rows; undefined = full head
  torch::Tensor ids_;   // [N] int64 on the head's device
};

}  // namespace specula
