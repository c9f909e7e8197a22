// Trains a SpecFormer drafter for a frozen target (paper Sec. 4.3, Eq. 6b).
//
// Loop per optimizer step (records chosen by an epoch permutation that depends only on (seed,
// epoch), so a resumed run sees the batches an uninterrupted one would):
//   1. batch_size records (prompt + response), right-padded to [B, T]
//   2. the frozen target's dense forward (no grad) returns the hooked hidden states [B*T, d]
//   3. hook + context causal attention over every position -> c [B*T, d] (with grad)
//   4. rows t whose slots have a response token to predict (t + 2 + j inside the response for
//      some j), optionally a random `position_fraction` of them -> slot states S [R, l_d, d]
//   5. intra-batch gradient accumulation: for each slot j, logits = target head(S.detach()[:, j]),
//      CE against token t + 2 + j (response tokens only), (CE_j / l_d).backward() into the
//      detached tensor; then one S.backward(grad) through the drafter. Only one slot's [R, V]
//      logits are alive at a time.
//   6. clip, AdamW (no weight decay on norms and biases), warmup + cosine.
// Data: the self-distillation dataset (the target's own greedy responses), or for the ablation
// raw corpus continuations (prompt and response both cut from the corpus).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/train/drafter_train_options.h"
#include "common/util/status.h"

namespace specula {

struct SpecFormerTrainOptions : DrafterTrainOptions {
  // Drafter shape (0 / empty = the target's / the paper's default).
  int64_t draft_len = 8;
  int64_t intermediate_size = 0;
  std::vector<int64_t> hidden_layers;
  bool causal_draft = false;
  bool pending_token = false;  // row t also reads token t + 1's embedding (SpecFormerConfig)

  double position_fraction = 1.0;  // share of eligible positions whose slots are trained
};

struct SpecFormerTrainResult : DrafterTrainRun {
  double first_loss = 0;  // the first step's training loss (mean over slots)
  double last_loss = 0;   // mean training loss of the last logging window
  // Validation (NaN / empty without validation records): mean over slots of CE, and per slot the
  // CE and the top-1 accuracy against the response token (a proxy for acceptance).
  double val_loss = 0;
  std::vector<double> val_slot_loss;
  std::vector<double> val_slot_accuracy;
};

// Writes out_dir/{config.json, model.safetensors, training.json} when finished, and
// out_dir/checkpoint/ every checkpoint_every steps (and when stopping early).
StatusOr<SpecFormerTrainResult> TrainSpecFormer(const SpecFormerTrainOptions& options);

}  // namespace specula
