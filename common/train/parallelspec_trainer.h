// Trains a ParallelSpec drafter for a frozen target: the paper's group-wise parallel training on
// the self-distillation dataset (or raw corpus continuations), the target's states computed on the
// fly.
//
// Per optimizer step: batch_size records (chosen by the (seed, epoch) permutation, so a resumed
// run sees the batches an uninterrupted one would), right-padded to [B, T]. The frozen target's
// dense forward (no grad) gives its features F (hidden layer `feature_layer`) and its top states
// H (layer L, for the soft labels p_t = softmax(lm_head(H_t)), the target's distribution of token
// t + 1). Rows (parallelspec_layout.h):
//   real row r = fuse(F_r + N(0, noise_std), e(x_{r+1})) at position r, r = 0..T-2;
//   mask (r, i) = fuse(0, M_i) at position r + i, for the groups r trained this step (a
//   group_fraction share of the eligible ones, seeded by (seed, step)).
// One group-wise forward (ParallelSpecImpl::GroupForward: shared real keys + per-row own-group
// keys; no (k+1)T x (k+1)T mask). Row (r, i) predicts x_{r+2+i}: it is in the loss when that is a
// response token. Its loss, EAGLE's weighting:
//   SmoothL1(h, F_{r+1+i}) + ce_weight * CE(p_{r+1+i}, softmax(lm_head(h)))
// (CE alone without target features); the step's loss is the mean over the real rows plus, for
// each i, the mean over the mask-i rows (summed over the group). AdamW (beta1, beta2 of the
// options; the paper's 0.9 / 0.95).
//
// Validation (the last val_records records, every group, no noise): the loss and the top-1
// agreement with the target's argmax at each depth 1..k+1 (a proxy for acceptance).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/train/drafter_train_options.h"
#include "common/util/status.h"

namespace specula {

class ParallelSpecImpl;
class CausalLMImpl;

struct ParallelSpecTrainOptions : DrafterTrainOptions {
  int64_t num_mask_tokens = 4;      // k
  bool use_target_features = true;  // false: the Medusa integration (token embeddings only)
  int64_t intermediate_size = 0;    // the layer's SwiGLU size (0 = the target's)
  double noise_std = 0.2;           // Gaussian noise on the input features (training only)
  double ce_weight = 0.1;           // EAGLE: regression 1, classification 0.1
  double group_fraction = 1.0;      // share of the eligible groups whose masks are trained
};

struct ParallelSpecTrainResult : DrafterTrainRun {
  double first_loss = 0;  // the first step's training loss
  double last_loss = 0;   // mean training loss of the last logging window
  // Validation (NaN / empty without validation records).
  double val_loss = 0;
  std::vector<double> val_top1;  // [k + 1]: depth 1 (the real row), 2..k+1 (masks)
};

// Writes out_dir/{config.json, model.safetensors} when finished, and out_dir/checkpoint/ every
// checkpoint_every steps (and when stopping early, and at the end).
StatusOr<ParallelSpecTrainResult> TrainParallelSpec(const ParallelSpecTrainOptions& options);

// The logits [G, 1 + k, V] (float32) training computes for the groups `groups` of one record
// `tokens` (no noise): row 0 of group r drafts x_{r+2}, row i x_{r+2+i}. What serving must
// reproduce for a sequence whose last committed position is r (no train/serve skew).
at::Tensor ParallelSpecTrainingLogits(ParallelSpecImpl& model, CausalLMImpl& target,
                                      const std::vector<int64_t>& tokens,
                                      const std::vector<int64_t>& groups);

}  // namespace specula
