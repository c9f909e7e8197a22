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

#include "common/train/lr_schedule.h"
#include "common/util/status.h"

namespace specula {

struct SpecFormerTrainOptions {
  std::string target_dir;    // the frozen target (config.json + safetensors)
  std::string distill_path;  // self-distillation dataset (see distill_dataset.h)
  // Ablation instead of distill_path: a token file (the corpus train split); record i is a prompt
  // of [16, 128] tokens at a random offset (seeded by i) and the raw_response_tokens after it.
  std::string raw_tokens;
  int64_t raw_records = 4000;
  int64_t raw_response_tokens = 256;
  std::string out_dir;  // final drafter + checkpoint/

  // Drafter shape (0 / empty = the target's / the paper's default).
  int64_t draft_len = 8;
  int64_t intermediate_size = 0;
  std::vector<int64_t> hidden_layers;
  bool causal_draft = false;

  int64_t batch_size = 8;
  int64_t max_seq_len = 0;         // records are cut to this (0 = the target's context)
  double position_fraction = 1.0;  // share of eligible positions whose slots are trained
  int64_t val_records = 64;        // the dataset's last records, never trained on
  LrSchedule lr;                   // lr.total_steps optimizer steps
  double weight_decay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;
  int64_t log_every = 10;
  int64_t eval_every = 100;
  int64_t checkpoint_every = 100;
  int64_t max_steps_this_run = 0;  // stop (after checkpointing) after this many; 0 = to the end
  uint64_t seed = 0;
  bool resume = true;
  bool quiet = false;
};

struct SpecFormerTrainResult {
  int64_t steps_done = 0;
  bool finished = false;
  double first_loss = 0;  // the first step's training loss (mean over slots)
  double last_loss = 0;   // mean training loss of the last logging window
  // Validation (NaN / empty without validation records): mean over slots of CE, and per slot the
  // CE and the top-1 accuracy against the response token (a proxy for acceptance).
  double val_loss = 0;
  std::vector<double> val_slot_loss;
  std::vector<double> val_slot_accuracy;
  int64_t tokens_seen = 0;  // record tokens run through the target
  double seconds = 0;
};

// Writes out_dir/{config.json, model.safetensors, training.json} when finished, and
// out_dir/checkpoint/ every checkpoint_every steps (and when stopping early).
StatusOr<SpecFormerTrainResult> TrainSpecFormer(const SpecFormerTrainOptions& options);

}  // namespace specula
