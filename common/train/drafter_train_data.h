// What the drafter trainers (SpecFormer, Beagle) share besides their options
// (drafter_train_options.h): the training records (a self-distillation dataset, or raw corpus
// windows for the ablation), the epoch-permuted record pick that makes a resumed run see the
// batches an uninterrupted one would, the progress line, and the checkpoint directory (the
// drafter's config.json + weights, optimizer.pt, state.json). Train-internal header (includes
// LibTorch).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/model/model_runner.h"
#include "common/train/distill_dataset.h"
#include "common/train/drafter_train_options.h"
#include "common/train/token_file.h"
#include "common/train/train_progress.h"
#include "common/util/status.h"

namespace specula {

// One training sequence: tokens[0..prompt_len) is the prompt, the rest the response.
struct TrainRecord {
  std::vector<int64_t> tokens;
  int64_t prompt_len = 0;
};

// The records a run draws from: a distill dataset or raw corpus windows, cut to max_len.
class RecordSource {
 public:
  static StatusOr<RecordSource> Open(const DrafterTrainOptions& o, int64_t vocab, int64_t max_len);

  int64_t size() const { return size_; }
  TrainRecord Get(int64_t i) const;

 private:
  std::optional<DistillDataset> distill_;
  std::optional<TokenFile> raw_;
  int64_t size_ = 0;
  int64_t max_len_ = 0;
  uint64_t seed_ = 0;
  int64_t raw_response_ = 256;
};

// INVALID_ARGUMENT for a missing out_dir, a batch size or step count that is not positive.
Status ValidateDrafterTrainOptions(const DrafterTrainOptions& o);

// The frozen target of a run (no grad, eval mode).
StatusOr<std::unique_ptr<ModelRunner>> LoadFrozenTarget(const std::string& target_dir);

// Records are cut to this length: max_seq_len, at most the target's context.
int64_t MaxRecordLength(const DrafterTrainOptions& o, const ModelConfig& target);

// The last val_n records (val_records, at most a quarter) are held out for validation.
struct RecordSplit {
  int64_t train_n = 0, val_n = 0;
};
StatusOr<RecordSplit> SplitRecords(const RecordSource& source, int64_t val_records);

// AdamW with the run's settings (common/train/adamw.h).
std::unique_ptr<torch::optim::AdamW> MakeDrafterAdamW(torch::nn::Module& model,
                                                      const DrafterTrainOptions& o);

// The records of optimizer step `step`: the (seed, epoch) permutation of the first train_n records
// at this step's offset.
std::vector<TrainRecord> StepRecords(const RecordSource& source, int64_t train_n, int64_t step,
                                     int64_t batch_size, uint64_t seed);

// The validation records (the last ones) in batches of batch_size, from train_n on.
std::vector<std::vector<TrainRecord>> ValidationBatches(const RecordSource& source, int64_t train_n,
                                                        int64_t batch_size);

// Sets every parameter group's learning rate.
void SetLearningRate(torch::optim::AdamW& optimizer, double lr);

// Resuming from dir (= out_dir/checkpoint) when dir/state.json exists: checks that dir/config.json
// equals `config_json` (FAILED_PRECONDITION "config differs" otherwise), loads the weights into
// `model` (as real, writable copies) and the optimizer state, and returns state.json (which has
// "step"). nullopt when there is nothing to resume; DATA_LOSS for a malformed checkpoint.
StatusOr<std::optional<nlohmann::json>> ResumeCheckpoint(const std::filesystem::path& dir,
                                                         const std::string& config_json,
                                                         torch::nn::Module& model,
                                                         torch::optim::Optimizer& optimizer);

// Writes dir/optimizer.pt and dir/state.json (the drafter's weights and config are the caller's).
Status SaveCheckpointState(const std::filesystem::path& dir, torch::optim::Optimizer& optimizer,
                           const nlohmann::json& state);

// The bookkeeping of a run's optimizer steps: each step's learning rate, update and record
// tokens, and the progress line with the mean loss of each logging window.
class StepAccounting {
 public:
  StepAccounting(const DrafterTrainOptions& o, torch::optim::AdamW& optimizer,
                 torch::nn::Module& model);
  // Before step `step`'s forward: its learning rate, zeroed gradients.
  void Begin(int64_t step);
  // After its backward. With `count` > 0 queries in the loss: INTERNAL for a non-finite loss,
  // otherwise clipping, the optimizer step, and the loss joins the logging window.
  Status Finish(int64_t step, double loss, int64_t count, int64_t record_tokens);
  // At done = step + 1 a multiple of log_every, or when `force`, with a loss in the window: prints
  // the progress line (unless quiet) and returns the window's mean loss, starting a new window.
  std::optional<double> Log(int64_t step, std::string_view stage, bool force);

 private:
  const DrafterTrainOptions& o_;
  torch::optim::AdamW& optimizer_;
  torch::nn::Module& model_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  int64_t steps_ = 0, tokens_ = 0;
  double loss_sum_ = 0;
  int64_t losses_ = 0;
};

// The step loop of a drafter run: hooks.train(step) for step = start_step .. total - 1 (one
// optimizer step and its progress line); hooks.evaluate(done) every eval_every steps and at the
// end when `validate`; a checkpoint every checkpoint_every steps and when stopping after
// max_steps_this_run steps of this run; at the end save_final() then a checkpoint. A c10::Error is
// returned as INTERNAL naming the step.
struct StepLoopHooks {
  std::function<Status(int64_t step)> train;
  std::function<void(int64_t done)> evaluate;
  std::function<Status(int64_t done)> save_checkpoint;
  std::function<Status()> save_final;
};
// Sets run->steps_done, finished and seconds.
Status RunStepLoop(const DrafterTrainOptions& o, int64_t start_step, bool validate,
                   const StepLoopHooks& hooks, DrafterTrainRun* run);

}  // namespace specula
