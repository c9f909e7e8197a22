#include "common/train/drafter_train_data.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "common/model/transformer.h"
#include "common/train/adamw.h"
#include "common/util/mapped_file.h"

namespace specula {

namespace fs = std::filesystem;

StatusOr<RecordSource> RecordSource::Open(const DrafterTrainOptions& o, int64_t vocab,
                                          int64_t max_len) {
  RecordSource s;
  s.max_len_ = max_len;
  s.seed_ = o.seed;
  s.raw_response_ = o.raw_response_tokens;
  if (!o.raw_tokens.empty()) {
    ASSIGN_OR_RETURN(TokenFile t, TokenFile::Open(o.raw_tokens));
    if (t.size() < 128 + o.raw_response_tokens + 1) {
      return InvalidArgumentError(StrCat(o.raw_tokens, ": too few tokens"));
    }
    if (o.raw_records <= 0) return InvalidArgumentError("raw_records must be positive");
    s.raw_ = std::move(t);
    s.size_ = o.raw_records;
  } else {
    if (o.distill_path.empty()) {
      return InvalidArgumentError("a distill dataset (or raw tokens) is required");
    }
    ASSIGN_OR_RETURN(DistillDataset d, DistillDataset::Open(o.distill_path));
    if (d.vocab_size() != vocab) {
      return InvalidArgumentError(StrCat(o.distill_path, ": vocabulary ", d.vocab_size(),
                                         " differs from the target's ", vocab));
    }
    s.size_ = static_cast<int64_t>(d.size());
    s.distill_ = std::move(d);
  }
  return s;
}

TrainRecord RecordSource::Get(int64_t i) const {
  TrainRecord r;
  if (distill_) {
    const DistillRecord d = (*distill_)[static_cast<size_t>(i)];
    r.tokens.assign(d.prompt.begin(), d.prompt.end());
    r.tokens.insert(r.tokens.end(), d.response.begin(), d.response.end());
    r.prompt_len = static_cast<int64_t>(d.prompt.size());
  } else {
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) + 7);
    const int64_t prompt = std::uniform_int_distribution<int64_t>(16, 128)(rng);
    const int64_t len = prompt + raw_response_;
    const int64_t start = std::uniform_int_distribution<int64_t>(0, raw_->size() - len - 1)(rng);
    for (int64_t t = start; t < start + len; ++t) r.tokens.push_back((*raw_)[t]);
    r.prompt_len = prompt;
  }
  if (static_cast<int64_t>(r.tokens.size()) > max_len_) r.tokens.resize(max_len_);
  return r;
}

Status ValidateDrafterTrainOptions(const DrafterTrainOptions& o) {
  if (o.out_dir.empty()) return InvalidArgumentError("out_dir is required");
  if (o.batch_size <= 0) return InvalidArgumentError("batch_size must be positive");
  if (o.lr.total_steps <= 0) return InvalidArgumentError("total steps must be positive");
  return OkStatus();
}

StatusOr<std::unique_ptr<ModelRunner>> LoadFrozenTarget(const std::string& target_dir) {
  ASSIGN_OR_RETURN(auto runner,
                   ModelRunner::Load(target_dir, ModelRunnerOptions{.kv = {.num_blocks = 1}}));
  std::shared_ptr<CausalLMImpl> target = runner->module();
  for (auto& p : target->parameters()) p.set_requires_grad(false);
  target->eval();
  return runner;
}

int64_t MaxRecordLength(const DrafterTrainOptions& o, const ModelConfig& target) {
  return o.max_seq_len > 0 ? std::min(o.max_seq_len, target.max_position_embeddings)
                           : target.max_position_embeddings;
}

StatusOr<RecordSplit> SplitRecords(const RecordSource& source, int64_t val_records) {
  RecordSplit split;
  split.val_n = std::min<int64_t>(std::max<int64_t>(val_records, 0), source.size() / 4);
  split.train_n = source.size() - split.val_n;
  if (split.train_n < 1) return InvalidArgumentError("the dataset has no training records");
  return split;
}

std::unique_ptr<torch::optim::AdamW> MakeDrafterAdamW(torch::nn::Module& model,
                                                      const DrafterTrainOptions& o) {
  return MakeAdamW(model, {.lr = o.lr.peak_lr,
                           .beta1 = o.beta1,
                           .beta2 = o.beta2,
                           .eps = o.adam_eps,
                           .weight_decay = o.weight_decay});
}

std::vector<TrainRecord> StepRecords(const RecordSource& source, int64_t train_n, int64_t step,
                                     int64_t batch_size, uint64_t seed) {
  std::vector<TrainRecord> records;
  std::vector<int64_t> perm;
  int64_t perm_epoch = -1;
  for (int64_t i = 0; i < batch_size; ++i) {
    const int64_t k = step * batch_size + i;
    const int64_t epoch = k / train_n;
    if (epoch != perm_epoch) {
      perm.resize(train_n);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(),
                   std::mt19937_64(seed * 0x9E3779B97F4A7C15ull + epoch + 1));
      perm_epoch = epoch;
    }
    records.push_back(source.Get(perm[k % train_n]));
  }
  return records;
}

std::vector<std::vector<TrainRecord>> ValidationBatches(const RecordSource& source, int64_t train_n,
                                                        int64_t batch_size) {
  std::vector<std::vector<TrainRecord>> batches;
  for (int64_t i = train_n; i < source.size(); i += batch_size) {
    batches.emplace_back();
    for (int64_t r = i; r < std::min(source.size(), i + batch_size); ++r) {
      batches.back().push_back(source.Get(r));
    }
  }
  return batches;
}

void SetLearningRate(torch::optim::AdamW& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

StatusOr<std::optional<nlohmann::json>> ResumeCheckpoint(const fs::path& dir,
                                                         const std::string& config_json,
                                                         torch::nn::Module& model,
                                                         torch::optim::Optimizer& optimizer) {
  if (!fs::exists(dir / "state.json")) return std::optional<nlohmann::json>();
  ASSIGN_OR_RETURN(std::string text, ReadFileToString((dir / "state.json").string()));
  auto state = nlohmann::json::parse(text, nullptr, false);
  if (state.is_discarded() || !state.contains("step")) {
    return DataLossError(StrCat((dir / "state.json").string(), ": malformed"));
  }
  ASSIGN_OR_RETURN(std::string saved_text, ReadFileToString((dir / "config.json").string()));
  auto saved = nlohmann::json::parse(saved_text, nullptr, false);
  if (saved.is_discarded() || saved != nlohmann::json::parse(config_json)) {
    return FailedPreconditionError(StrCat(dir.string(),
                                          ": the checkpoint's config differs from this run's "
                                          "(different flags?); use a new --out or --resume=false"));
  }
  RETURN_IF_ERROR(LoadWeightsInto(model, dir.string()));
  {
    torch::NoGradGuard no_grad;  // training writes: take real copies of the mapped tensors
    for (auto& p : model.named_parameters()) p.value().set_data(p.value().clone());
  }
  try {
    torch::load(optimizer, (dir / "optimizer.pt").string());
  } catch (const c10::Error& e) {
    return DataLossError(StrCat("cannot load optimizer state: ", e.what_without_backtrace()));
  }
  return std::optional<nlohmann::json>(std::move(state));
}

Status SaveCheckpointState(const fs::path& dir, torch::optim::Optimizer& optimizer,
                           const nlohmann::json& state) {
  try {
    torch::save(optimizer, (dir / "optimizer.pt").string());
  } catch (const c10::Error& e) {
    return InternalError(StrCat("cannot save optimizer: ", e.what_without_backtrace()));
  }
  return WriteStringToFile((dir / "state.json").string(), state.dump(2) + "\n");
}

StepAccounting::StepAccounting(const DrafterTrainOptions& o, torch::optim::AdamW& optimizer,
                               torch::nn::Module& model)
    : o_(o), optimizer_(optimizer), model_(model) {}

void StepAccounting::Begin(int64_t step) {
  SetLearningRate(optimizer_, o_.lr.At(step));
  optimizer_.zero_grad();
}

Status StepAccounting::Finish(int64_t step, double loss, int64_t count, int64_t record_tokens) {
  ++steps_;
  tokens_ += record_tokens;
  if (count == 0) return OkStatus();
  if (!std::isfinite(loss)) return InternalError(StrCat("loss became ", loss, " at step ", step));
  if (o_.grad_clip > 0) torch::nn::utils::clip_grad_norm_(model_.parameters(), o_.grad_clip);
  optimizer_.step();
  loss_sum_ += loss;
  ++losses_;
  return OkStatus();
}

std::optional<double> StepAccounting::Log(int64_t step, std::string_view stage, bool force) {
  const int64_t done = step + 1;
  if (losses_ == 0 || !(force || done % o_.log_every == 0)) return std::nullopt;
  const double mean = loss_sum_ / losses_;
  if (!o_.quiet) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(
        stderr, "%s\n",
        ProgressLine(done, o_.lr.total_steps, stage, mean, o_.lr.At(step), tokens_, steps_, elapsed)
            .c_str());
  }
  loss_sum_ = 0;
  losses_ = 0;
  return mean;
}

Status RunStepLoop(const DrafterTrainOptions& o, int64_t start_step, bool validate,
                   const StepLoopHooks& hooks, DrafterTrainRun* run) {
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t total = o.lr.total_steps;
  int64_t steps_this_run = 0;
  int64_t step = start_step;
  try {
    for (; step < total; ++step) {
      RETURN_IF_ERROR(hooks.train(step));
      ++steps_this_run;
      const int64_t done = step + 1;
      if (validate && o.eval_every > 0 && (done % o.eval_every == 0 || done == total)) {
        hooks.evaluate(done);
      }
      const bool stop_now =
          o.max_steps_this_run > 0 && steps_this_run >= o.max_steps_this_run && done < total;
      if ((o.checkpoint_every > 0 && done % o.checkpoint_every == 0) || stop_now) {
        RETURN_IF_ERROR(hooks.save_checkpoint(done));
      }
      if (stop_now) {
        ++step;
        break;
      }
    }
  } catch (const c10::Error& e) {
    return InternalError(
        StrCat("training failed at step ", step, ": ", e.what_without_backtrace()));
  }
  run->steps_done = step;
  run->finished = step >= total;
  run->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (run->finished) {
    RETURN_IF_ERROR(hooks.save_final());
    RETURN_IF_ERROR(hooks.save_checkpoint(step));
  }
  return OkStatus();
}

}  // namespace specula
