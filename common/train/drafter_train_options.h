// The options every drafter training run has (SpecFormer, Beagle) and what every run reports;
// each trainer's options and result extend them. Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "common/train/lr_schedule.h"

namespace specula {

// Options of every drafter training run; each trainer's options extend these.
struct DrafterTrainOptions {
  std::string target_dir;    // the frozen target (config.json + safetensors)
  std::string distill_path;  // self-distillation dataset (see distill_dataset.h)
  // Ablation instead of distill_path: a token file (the corpus train split); record i is a prompt
  // of [16, 128] tokens at a random offset (seeded by i) and the raw_response_tokens after it.
  std::string raw_tokens;
  int64_t raw_records = 4000;
  int64_t raw_response_tokens = 256;
  std::string out_dir;  // final drafter + checkpoint/

  int64_t batch_size = 8;
  int64_t max_seq_len = 0;   // records are cut to this (0 = the target's context)
  int64_t val_records = 64;  // the dataset's last records, never trained on
  LrSchedule lr;             // lr.total_steps optimizer steps
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

// What every drafter run reports; each trainer's result extends it.
struct DrafterTrainRun {
  int64_t steps_done = 0;  // the next step to train
  bool finished = false;
  int64_t tokens_seen = 0;  // record tokens run through the target
  double seconds = 0;       // this run
};

}  // namespace specula
