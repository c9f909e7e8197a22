// Trains a Beagle drafter for a frozen target: the paper's two-stage block-attention training
// (Sec. 4.2), on the self-distillation dataset (or raw corpus continuations, as for SpecFormer).
//
// Per optimizer step: batch_size records (prompt + response, chosen by the (seed, epoch)
// permutation so a resumed run sees the batches an uninterrupted one would), right-padded to
// [B, T]; the frozen target's dense forward (no grad) gives the true states H [B, T, d] (its top
// hidden states, after the final norm) and the soft labels p_t = softmax(lm_head(H_t)), the
// target's distribution of token t + 1. The query at position t (token t_t) predicts token t + 1;
// it is in the loss when t + 1 is a response token and it sees at least one key. Its loss is
//   CE(p_t, softmax(lm_head(h_t))) + vloss_weight * SmoothL1(h_t, H_t)
// (the second term is EAGLE's hidden-state regression: it makes a drafted h_t usable as a key).
// Keys/values come from H + N(0, noise_std) (noise only in training). Each record draws its own
// window offset eps in [0, k) per step (seeded by (seed, step, record)); see beagle_masks.h.
//
//   Early stage (the first early_fraction of the steps): one forward under the inverse block mask
//   (query at window position i sees only the true keys up to the window start n_w), loss = mean
//   over the eligible queries, every window position weighted alike (multi-token prediction).
//   Late stage (training-time simulation, s = sim_steps <= k): a predicted-state buffer [B*T, d]
//   (zeros) holds the drafted states. Simulation step i = 1..s runs only the queries at window
//   position i (about T / k rows), against keys [true ; predicted] under the step's late mask
//   (true keys <= n_w, predicted keys n_w < j < t); its loss (mean over those queries) is
//   backpropagated at once with weight (k - i + 1) / sum_{i'=1..s} (k - i' + 1), and the
//   detached h of those queries is written into the buffer at their positions.
//
// Constant memory in s, by choice: the predicted states are stop-gradient (detached when written),
// so each simulation step's graph is freed by its own backward and only one step's attention is
// alive at a time. Gradients still reach W_K / W_V through the predicted keys (the projections of
// the detached states), and the true keys' graph is built once per step: its gradient is
// accumulated on a detached copy and backpropagated once after the last simulation step. The paper
// does not say whether gradients flow through the written states; stopping them is what makes the
// simulation constant-space. Queries at window positions > s are not trained in the late stage.
//
// Validation (the last val_records records, a fixed offset per record, no noise): the early loss,
// the late loss (the weighted simulation loss, steps 1..s) and, simulating all k steps, the top-1
// agreement with the target's argmax at each depth (window position) 1..k.
#pragma once

#include <cstdint>
#include <vector>

#include "common/train/drafter_train_options.h"
#include "common/util/status.h"

namespace specula {

struct BeagleTrainOptions : DrafterTrainOptions {
  BeagleTrainOptions() { grad_clip = 0.5; }  // the paper's

  int64_t intermediate_size = 0;  // the block's SwiGLU size (0 = the target's)
  int64_t window = 5;             // k
  int64_t sim_steps = 4;          // s, 1..k
  double early_fraction = 0.5;    // share of the steps in the early stage
  double noise_std = 0.2;         // Gaussian noise on the true states (training only)
  // Weight of the hidden-state regression (the paper: 10x the CE weight; see the CLI's default).
  double vloss_weight = 1.0;
};

struct BeagleTrainResult : DrafterTrainRun {
  int64_t early_steps = 0;  // steps [0, early_steps) are the early stage
  // Training loss (see above) per stage: the stage's first step, and the mean of its last logging
  // window. NaN for a stage that did not run.
  double early_first_loss = 0, early_last_loss = 0;
  double late_first_loss = 0, late_last_loss = 0;
  // Validation (NaN / empty without validation records).
  double val_early_loss = 0;
  double val_late_loss = 0;
  std::vector<double> val_top1;  // [k]: depth i + 1
};

// Writes out_dir/{config.json, model.safetensors} when finished, and out_dir/checkpoint/ every
// checkpoint_every steps (and when stopping early, and at the end).
StatusOr<BeagleTrainResult> TrainBeagle(const BeagleTrainOptions& options);

}  // namespace specula
