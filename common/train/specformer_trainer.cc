#include "common/train/specformer_trainer.h"

#include "common/train/adamw.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>

#include "common/drafters/specformer/specformer_model.h"
#include "common/model/model_runner.h"
#include "common/model/transformer.h"
#include "common/train/distill_dataset.h"
#include "common/train/token_file.h"
#include "common/util/mapped_file.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int64_t kIgnore = -100;

// One training sequence: tokens[0..prompt_len) is the prompt, the rest the response.
struct TrainRecord {
  std::vector<int64_t> tokens;
  int64_t prompt_len = 0;
};

// The records a run draws from: a distill dataset or raw corpus windows, cut to max_len.
class RecordSource {
 public:
  static StatusOr<RecordSource> Open(const SpecFormerTrainOptions& o, int64_t vocab,
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

  int64_t size() const { return size_; }

  TrainRecord Get(int64_t i) const {
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

 private:
  std::optional<DistillDataset> distill_;
  std::optional<TokenFile> raw_;
  int64_t size_ = 0;
  int64_t max_len_ = 0;
  uint64_t seed_ = 0;
  int64_t raw_response_ = 256;
};

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ldh%02ldm%02lds", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

// A padded batch and, per slot-trained row, its targets.
struct Batch {
  torch::Tensor tokens;  // [B, T] int64, right-padded with 0
  int64_t B = 0, T = 0;
  std::vector<int64_t> rows;  // [R] flat rows b * T + t whose slots are trained
  torch::Tensor targets;      // [R, l_d] token t + 2 + j, or kIgnore outside the response
  int64_t record_tokens = 0;
};

// Rows t of each record with a response token at t + 2 + j for some slot j; `keep` (0, 1] is
// the share of them kept (chosen by `rng`).
Batch MakeBatch(const std::vector<TrainRecord>& records, int64_t l_d, double keep,
                std::mt19937_64& rng) {
  Batch b;
  b.B = static_cast<int64_t>(records.size());
  for (const auto& r : records) b.T = std::max<int64_t>(b.T, r.tokens.size());
  b.tokens = torch::zeros({b.B, b.T}, torch::kLong);
  auto acc = b.tokens.accessor<int64_t, 2>();
  std::vector<int64_t> targets;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t i = 0; i < b.B; ++i) {
    const TrainRecord& r = records[i];
    const int64_t n = static_cast<int64_t>(r.tokens.size());
    b.record_tokens += n;
    for (int64_t t = 0; t < n; ++t) acc[i][t] = r.tokens[t];
    // Slot j at t predicts t + 2 + j, a response token when prompt_len <= t + 2 + j < n.
    for (int64_t t = std::max<int64_t>(0, r.prompt_len - 1 - l_d); t + 2 < n; ++t) {
      if (keep < 1.0 && u(rng) >= keep) continue;
      bool any = false;
      std::vector<int64_t> row(l_d, kIgnore);
      for (int64_t j = 0; j < l_d; ++j) {
        const int64_t target = t + 2 + j;
        if (target >= r.prompt_len && target < n) {
          row[j] = r.tokens[target];
          any = true;
        }
      }
      if (!any) continue;
      b.rows.push_back(i * b.T + t);
      targets.insert(targets.end(), row.begin(), row.end());
    }
  }
  b.targets = torch::tensor(targets, torch::kLong).view({-1, l_d});
  return b;
}

// The target's hooked hidden states of a [B, T] batch, each [B * T, d] (no grad).
std::vector<torch::Tensor> TargetHidden(CausalLMImpl& target, const Batch& b,
                                        const std::vector<int64_t>& layers) {
  torch::NoGradGuard no_grad;
  auto positions = torch::arange(b.T, torch::kLong).repeat({b.B});
  AttentionInputs in = target.DenseCausalInputs(b.B, b.T, positions);
  return target.forward(b.tokens.reshape({b.B * b.T}), in, nullptr, layers).hidden_states;
}

// Slot states [R, l_d, d] of a batch (with grad when enabled).
torch::Tensor SlotStates(SpecFormerImpl& model, CausalLMImpl& target, const Batch& b) {
  auto hidden = TargetHidden(target, b, model.config().hidden_layers);
  AttentionInputs in = model.DenseContextInputs(b.B, b.T);
  auto c = model.Context(model.Hook(hidden), in, nullptr);  // [B * T, d]
  auto index = torch::tensor(b.rows, torch::kLong);
  return model.Slots(c.index_select(0, index));
}

struct SlotStats {
  std::vector<double> loss, correct, count;
};

// Per-slot summed CE, top-1 hits and counts over a batch; with `backward`, the intra-batch
// gradient accumulation (each slot's head + CE backpropagated into the detached states, then one
// backward through the drafter) of mean over slots of the per-slot mean CE.
SlotStats RunSlots(SpecFormerImpl& model, const torch::Tensor& states, const torch::Tensor& targets,
                   bool backward) {
  const int64_t l_d = states.size(1);
  SlotStats s{std::vector<double>(l_d, 0), std::vector<double>(l_d, 0),
              std::vector<double>(l_d, 0)};
  auto detached = states.detach().requires_grad_(backward);
  for (int64_t j = 0; j < l_d; ++j) {
    auto target = targets.select(1, j);
    const int64_t n = target.ne(kIgnore).sum().item<int64_t>();
    if (n == 0) continue;
    auto logits = model.Logits(detached.select(1, j)).to(torch::kFloat);  // [R, V]
    auto loss = torch::nn::functional::cross_entropy(
        logits, target,
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnore).reduction(
            torch::kSum));
    {
      torch::NoGradGuard no_grad;
      s.correct[j] = logits.argmax(-1).eq(target).sum().item<double>();
    }
    s.loss[j] = loss.item<double>();
    s.count[j] = static_cast<double>(n);
    if (backward) (loss / (static_cast<double>(n) * l_d)).backward();
  }
  if (backward && detached.grad().defined()) states.backward(detached.grad());
  return s;
}

double MeanSlotLoss(const SlotStats& s) {
  double total = 0;
  int64_t slots = 0;
  for (size_t j = 0; j < s.loss.size(); ++j) {
    if (s.count[j] > 0) {
      total += s.loss[j] / s.count[j];
      ++slots;
    }
  }
  return slots ? total / slots : std::nan("");
}

}  // namespace

StatusOr<SpecFormerTrainResult> TrainSpecFormer(const SpecFormerTrainOptions& o) {
  if (o.out_dir.empty()) return InvalidArgumentError("out_dir is required");
  if (o.batch_size <= 0) return InvalidArgumentError("batch_size must be positive");
  if (!(o.position_fraction > 0 && o.position_fraction <= 1)) {
    return InvalidArgumentError(
        StrCat("position_fraction must be in (0, 1], got ", o.position_fraction));
  }
  if (o.lr.total_steps <= 0) return InvalidArgumentError("total steps must be positive");
  ASSIGN_OR_RETURN(auto runner,
                   ModelRunner::Load(o.target_dir, ModelRunnerOptions{.kv = {.num_blocks = 1}}));
  std::shared_ptr<CausalLMImpl> target = runner->module();
  const ModelConfig& tc = runner->config();
  for (auto& p : target->parameters()) p.set_requires_grad(false);
  target->eval();

  SpecFormerConfig config = SpecFormerConfig::ForTarget(tc, o.draft_len);
  config.target_model = o.target_dir;
  if (o.intermediate_size > 0) config.intermediate_size = o.intermediate_size;
  if (!o.hidden_layers.empty()) config.hidden_layers = o.hidden_layers;
  config.causal_draft = o.causal_draft;
  RETURN_IF_ERROR(config.Validate("SpecFormer config"));
  const int64_t l_d = config.draft_len;
  const int64_t max_len = o.max_seq_len > 0 ? std::min(o.max_seq_len, tc.max_position_embeddings)
                                            : tc.max_position_embeddings;

  ASSIGN_OR_RETURN(RecordSource source, RecordSource::Open(o, tc.vocab_size, max_len));
  const int64_t val_n = std::min<int64_t>(std::max<int64_t>(o.val_records, 0), source.size() / 4);
  const int64_t train_n = source.size() - val_n;
  if (train_n < 1) return InvalidArgumentError("the dataset has no training records");

  torch::manual_seed(o.seed);
  auto model = std::make_shared<SpecFormerImpl>(config, tc);
  model->InitWeights(o.seed);
  model->SetTargetHead(target->model->norm->weight, target->lm_head_weight(), tc.rms_norm_eps);
  model->train();

  std::unique_ptr<torch::optim::AdamW> adamw = MakeAdamW(*model, {.lr = o.lr.peak_lr,
                                                                  .beta1 = o.beta1,
                                                                  .beta2 = o.beta2,
                                                                  .eps = o.adam_eps,
                                                                  .weight_decay = o.weight_decay});
  torch::optim::AdamW& optimizer = *adamw;

  SpecFormerTrainResult result;
  result.val_loss = std::nan("");
  const fs::path ckpt_dir = fs::path(o.out_dir) / "checkpoint";
  int64_t start_step = 0;
  if (o.resume && fs::exists(ckpt_dir / "state.json")) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString((ckpt_dir / "state.json").string()));
    auto state = nlohmann::json::parse(text, nullptr, false);
    if (state.is_discarded() || !state.contains("step")) {
      return DataLossError(StrCat((ckpt_dir / "state.json").string(), ": malformed"));
    }
    ASSIGN_OR_RETURN(SpecFormerConfig saved,
                     SpecFormerConfig::FromFile((ckpt_dir / "config.json").string()));
    if (saved.ToJson() != config.ToJson()) {
      return FailedPreconditionError(
          StrCat(ckpt_dir.string(),
                 ": the checkpoint's config differs from this run's "
                 "(different flags?); use a new --out or --resume=false"));
    }
    RETURN_IF_ERROR(LoadWeightsInto(*model, ckpt_dir.string()));
    {
      torch::NoGradGuard no_grad;  // training writes: take real copies of the mapped tensors
      for (auto& p : model->named_parameters()) p.value().set_data(p.value().clone());
    }
    try {
      torch::load(optimizer, (ckpt_dir / "optimizer.pt").string());
    } catch (const c10::Error& e) {
      return DataLossError(StrCat("cannot load optimizer state: ", e.what_without_backtrace()));
    }
    start_step = state["step"].get<int64_t>();
    result.tokens_seen = state.value("tokens_seen", int64_t{0});
    result.first_loss = state.value("first_loss", 0.0);
    if (!o.quiet) std::fprintf(stderr, "resuming from step %ld\n", start_step);
  }

  auto save_checkpoint = [&](int64_t step) -> Status {
    RETURN_IF_ERROR(SaveSpecFormerDir(*model, ckpt_dir.string()));
    try {
      torch::save(optimizer, (ckpt_dir / "optimizer.pt").string());
    } catch (const c10::Error& e) {
      return InternalError(StrCat("cannot save optimizer: ", e.what_without_backtrace()));
    }
    nlohmann::json state = {{"step", step},
                            {"tokens_seen", result.tokens_seen},
                            {"first_loss", result.first_loss},
                            {"seed", o.seed}};
    return WriteStringToFile((ckpt_dir / "state.json").string(), state.dump(2) + "\n");
  };

  // Validation: the last val_n records, all eligible positions, in batches.
  auto evaluate = [&]() {
    torch::NoGradGuard no_grad;
    model->eval();
    SlotStats total{std::vector<double>(l_d, 0), std::vector<double>(l_d, 0),
                    std::vector<double>(l_d, 0)};
    std::mt19937_64 unused(0);
    for (int64_t i = train_n; i < source.size(); i += o.batch_size) {
      std::vector<TrainRecord> records;
      for (int64_t r = i; r < std::min(source.size(), i + o.batch_size); ++r) {
        records.push_back(source.Get(r));
      }
      Batch b = MakeBatch(records, l_d, 1.0, unused);
      if (b.rows.empty()) continue;
      SlotStats s = RunSlots(*model, SlotStates(*model, *target, b), b.targets, false);
      for (int64_t j = 0; j < l_d; ++j) {
        total.loss[j] += s.loss[j];
        total.correct[j] += s.correct[j];
        total.count[j] += s.count[j];
      }
    }
    model->train();
    result.val_loss = MeanSlotLoss(total);
    result.val_slot_loss.assign(l_d, std::nan(""));
    result.val_slot_accuracy.assign(l_d, std::nan(""));
    for (int64_t j = 0; j < l_d; ++j) {
      if (total.count[j] > 0) {
        result.val_slot_loss[j] = total.loss[j] / total.count[j];
        result.val_slot_accuracy[j] = total.correct[j] / total.count[j];
      }
    }
  };

  const int64_t total = o.lr.total_steps;
  auto t_start = Clock::now();
  int64_t steps_this_run = 0, tokens_this_run = 0;
  double loss_acc = 0;
  int64_t loss_count = 0;
  int64_t step = start_step;
  try {
    for (; step < total; ++step) {
      // Records of this step: the epoch's permutation (seeded by epoch) at this step's offset.
      std::vector<TrainRecord> records;
      for (int64_t i = 0; i < o.batch_size; ++i) {
        const int64_t k = step * o.batch_size + i;
        const int64_t epoch = k / train_n;
        std::vector<int64_t> perm(train_n);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(),
                     std::mt19937_64(o.seed * 0x9E3779B97F4A7C15ull + epoch + 1));
        records.push_back(source.Get(perm[k % train_n]));
      }
      std::mt19937_64 rng(o.seed * 0xBF58476D1CE4E5B9ull + static_cast<uint64_t>(step));
      Batch b = MakeBatch(records, l_d, o.position_fraction, rng);
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(o.lr.At(step));
      }
      optimizer.zero_grad();
      double step_loss = std::nan("");
      if (!b.rows.empty()) {
        SlotStats s = RunSlots(*model, SlotStates(*model, *target, b), b.targets, true);
        step_loss = MeanSlotLoss(s);
        if (!std::isfinite(step_loss)) {
          return InternalError(StrCat("loss became ", step_loss, " at step ", step));
        }
        if (o.grad_clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), o.grad_clip);
        optimizer.step();
        loss_acc += step_loss;
        ++loss_count;
      }
      if (step == 0) result.first_loss = step_loss;
      result.tokens_seen += b.record_tokens;
      tokens_this_run += b.record_tokens;
      ++steps_this_run;

      const int64_t done = step + 1;
      if (!o.quiet && (done % o.log_every == 0 || done == total) && loss_count > 0) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
        const double eta = (total - done) * (elapsed / steps_this_run);
        std::fprintf(stderr,
                     "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | elapsed %s | ETA %s\n",
                     done, total, loss_acc / loss_count, o.lr.At(step), tokens_this_run / elapsed,
                     FormatDuration(elapsed).c_str(), FormatDuration(eta).c_str());
      }
      if (loss_count > 0 && (done % o.log_every == 0 || done == total)) {
        result.last_loss = loss_acc / loss_count;
        loss_acc = 0;
        loss_count = 0;
      }
      if (val_n > 0 && o.eval_every > 0 && (done % o.eval_every == 0 || done == total)) {
        evaluate();
        if (!o.quiet) {
          std::string slots;
          for (int64_t j = 0; j < l_d; ++j) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%s%.3f", j ? " " : "", result.val_slot_accuracy[j]);
            slots += buf;
          }
          std::fprintf(stderr, "step %ld | val loss %.4f | val top-1 by slot [%s]\n", done,
                       result.val_loss, slots.c_str());
        }
      }
      const bool stop_now =
          o.max_steps_this_run > 0 && steps_this_run >= o.max_steps_this_run && done < total;
      if ((o.checkpoint_every > 0 && done % o.checkpoint_every == 0) || stop_now) {
        RETURN_IF_ERROR(save_checkpoint(done));
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
  result.steps_done = step;
  result.finished = step >= total;
  result.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (result.finished) {
    model->eval();
    RETURN_IF_ERROR(SaveSpecFormerDir(*model, o.out_dir));
    RETURN_IF_ERROR(save_checkpoint(step));
  }
  return result;
}

}  // namespace specula
