// Causal language model training (the bundled target and the standalone draft LM) with LibTorch
// autograd on the same CausalLM modules that serve.
//
// Loop per step: sample batch_size windows of seq_len + 1 tokens from the training stream (packing:
// windows cross document boundaries, which are marked by the end-of-text token), next-token
// cross-entropy, backward, clip, AdamW with warmup + cosine. Windows depend only on (seed, step),
// so a resumed run sees exactly the batches an uninterrupted one would.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/model/model_config.h"
#include "common/train/lr_schedule.h"
#include "common/train/token_file.h"
#include "common/util/status.h"

namespace specula {

struct LmTrainOptions {
  std::string train_tokens;  // token file (see token_file.h)
  std::string val_tokens;    // optional
  std::string out_dir;       // final model + checkpoint/
  int64_t batch_size = 16;
  int64_t seq_len = 256;
  int64_t grad_accum = 1;
  LrSchedule lr;  // lr.total_steps is the number of optimizer steps
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;
  int64_t log_every = 10;
  int64_t eval_every = 250;
  int64_t eval_batches = 16;
  int64_t checkpoint_every = 250;
  // Stop (after checkpointing) once this many steps ran in this invocation; 0 = run to the end.
  // Lets a long run span several sessions.
  int64_t max_steps_this_run = 0;
  uint64_t seed = 0;
  bool depth_scaled_init = true;  // see CausalLMImpl::InitWeights
  // A model directory whose weights start the run instead of a fresh init (fine-tuning, e.g. the
  // draft LM on the self-distillation set); its config must be the one passed in.
  std::string init_from;
  bool resume = true;  // continue from out_dir/checkpoint if present
  bool quiet = false;
};

struct LmTrainResult {
  int64_t steps_done = 0;
  bool finished = false;  // reached lr.total_steps
  double last_train_loss = 0;
  double last_val_loss = 0;  // NaN if no validation file
  int64_t tokens_seen = 0;
};

// Writes out_dir/{config.json, model.safetensors} when finished, and out_dir/checkpoint/ every
// checkpoint_every steps (and when stopping early).
StatusOr<LmTrainResult> TrainLanguageModel(const ModelConfig& config,
                                           const LmTrainOptions& options);

// Mean next-token cross-entropy (nats) of a saved model dir over non-overlapping seq_len windows of
// a token file (max_windows = 0: all). Perplexity = exp(loss).
StatusOr<double> EvaluateModelLoss(const std::string& model_dir, const std::string& tokens_path,
                                   int64_t seq_len, int64_t batch_size, int64_t max_windows);

}  // namespace specula
