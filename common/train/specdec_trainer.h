// Trains a SpecDec Spec-Drafter (common/drafters/specdec/) on the target's self-distillation data
// (the paper's sequence-level knowledge distillation). The target is not run: the drafter is
// token-only, and the dataset already holds the target's greedy responses.
//
// Loop per optimizer step (records chosen by the epoch permutation of drafter_train_data.h):
//   1. batch_size records, right-padded to [B, T]; per record `splits_per_record` random split
//      points p in [prompt_len - 1, n - 2] (the prefix ends in the prompt's last token or inside
//      the response); draft (b, s) has labels x_{p+1..p+k} (-1 past the record's end)
//   2. glancing (ratio r annealed linearly from glancing_ratio to 0; 0 = off): a first pass
//      without gradient predicts every slot, then round(r x wrong) of each draft's wrong slots
//      show their gold token as input (GlancingReveal)
//   3. the second pass (TrainLogits, with gradient): label-smoothed CE on the slots not revealed
//   4. clip, Adam (0.9/0.999, eps 1e-6, decoupled weight decay 0.01 on matrices), linear warmup
//      then inverse-sqrt decay (the paper's optimiser; the CLI's defaults for this kind)
// Validation: the held-out records' drafts (fixed split points, no glancing), per-slot CE and
// top-1 accuracy (a proxy for acceptance at each depth).
#pragma once

#include <cstdint>
#include <vector>

#include "common/train/drafter_train_options.h"
#include "common/util/status.h"

namespace specula {

struct SpecDecTrainOptions : DrafterTrainOptions {
  // Drafter shape (see SpecDecConfig).
  int64_t hidden_size = 128;
  int64_t encoder_layers = 4;
  int64_t decoder_layers = 2;
  int64_t num_slots = 8;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t head_dim = 32;
  int64_t intermediate_size = 384;

  int64_t splits_per_record = 16;  // drafts trained per record and step
  double glancing_ratio = 0.5;     // start of the annealed ratio; 0 = no glancing
  double label_smoothing = 0.1;
  // A token-only Llama LM of the encoder's geometry whose embedding, final norm and first layers
  // initialise the context encoder (SpecDecImpl::InitEncoderFrom); empty = random init.
  std::string init_encoder_from;
};

struct SpecDecTrainResult : DrafterTrainRun {
  double first_loss = 0;  // the first step's training loss
  double last_loss = 0;   // mean training loss of the last logging window
  double val_loss = 0;    // mean over slots of the validation CE (NaN without validation)
  std::vector<double> val_slot_loss;
  std::vector<double> val_slot_accuracy;
  int64_t parameters = 0;
  int64_t encoder_layers_initialised = 0;  // from init_encoder_from
};

// Writes out_dir/{config.json, model.safetensors} when finished, and out_dir/checkpoint/ every
// checkpoint_every steps (and when stopping early). INVALID_ARGUMENT names a bad option.
StatusOr<SpecDecTrainResult> TrainSpecDec(const SpecDecTrainOptions& options);

}  // namespace specula
