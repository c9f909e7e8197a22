#include "common/train/specformer_trainer.h"

#include <torch/torch.h>

#include <algorithm>
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
#include "common/train/drafter_train_data.h"
#include "common/util/mapped_file.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kIgnore = -100;

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
  torch::Tensor next;  // row (b, t)'s token at t + 1 (the padding 0 after each record's end)
  if (model.config().pending_token) {
    next = torch::cat({b.tokens.narrow(1, 1, b.T - 1), torch::zeros({b.B, 1}, torch::kLong)}, 1)
               .reshape({b.B * b.T});
  }
  auto c = model.Context(model.Hook(hidden, next), in, nullptr);  // [B * T, d]
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
  RETURN_IF_ERROR(ValidateDrafterTrainOptions(o));
  if (!(o.position_fraction > 0 && o.position_fraction <= 1)) {
    return InvalidArgumentError(
        StrCat("position_fraction must be in (0, 1], got ", o.position_fraction));
  }
  ASSIGN_OR_RETURN(auto runner, LoadFrozenTarget(o.target_dir));
  std::shared_ptr<CausalLMImpl> target = runner->module();
  const ModelConfig& tc = runner->config();

  SpecFormerConfig config = SpecFormerConfig::ForTarget(tc, o.draft_len);
  config.target_model = o.target_dir;
  if (o.intermediate_size > 0) config.intermediate_size = o.intermediate_size;
  if (!o.hidden_layers.empty()) config.hidden_layers = o.hidden_layers;
  config.causal_draft = o.causal_draft;
  config.pending_token = o.pending_token;
  RETURN_IF_ERROR(config.Validate("SpecFormer config"));
  const int64_t l_d = config.draft_len;

  ASSIGN_OR_RETURN(RecordSource source,
                   RecordSource::Open(o, tc.vocab_size, MaxRecordLength(o, tc)));
  ASSIGN_OR_RETURN(const RecordSplit split, SplitRecords(source, o.val_records));

  torch::manual_seed(o.seed);
  auto model = std::make_shared<SpecFormerImpl>(config, tc);
  model->InitWeights(o.seed);
  model->SetTargetWeights(target->model->embed_tokens->weight, target->model->norm->weight,
                          target->lm_head_weight(), tc.rms_norm_eps);
  model->train();

  std::unique_ptr<torch::optim::AdamW> adamw = MakeDrafterAdamW(*model, o);
  torch::optim::AdamW& optimizer = *adamw;

  SpecFormerTrainResult result;
  result.val_loss = std::nan("");
  const fs::path ckpt_dir = fs::path(o.out_dir) / "checkpoint";
  int64_t start_step = 0;
  if (o.resume) {
    ASSIGN_OR_RETURN(std::optional<nlohmann::json> state,
                     ResumeCheckpoint(ckpt_dir, config.ToJson(), *model, optimizer));
    if (state) {
      start_step = (*state)["step"].get<int64_t>();
      result.tokens_seen = state->value("tokens_seen", int64_t{0});
      result.first_loss = state->value("first_loss", 0.0);
      if (!o.quiet) std::fprintf(stderr, "resuming from step %ld\n", start_step);
    }
  }

  auto save_checkpoint = [&](int64_t step) -> Status {
    RETURN_IF_ERROR(SaveSpecFormerDir(*model, ckpt_dir.string()));
    return SaveCheckpointState(ckpt_dir, optimizer,
                               {{"step", step},
                                {"tokens_seen", result.tokens_seen},
                                {"first_loss", result.first_loss},
                                {"seed", o.seed}});
  };

  // Validation: the last val_n records, all eligible positions, in batches.
  auto evaluate = [&]() {
    torch::NoGradGuard no_grad;
    model->eval();
    SlotStats total{std::vector<double>(l_d, 0), std::vector<double>(l_d, 0),
                    std::vector<double>(l_d, 0)};
    std::mt19937_64 unused(0);
    for (const auto& records : ValidationBatches(source, split.train_n, o.batch_size)) {
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
  StepAccounting accounting(o, optimizer, *model);
  auto train_step = [&](int64_t step) -> Status {
    // Records of this step: the epoch's permutation (seeded by epoch) at this step's offset.
    std::vector<TrainRecord> records =
        StepRecords(source, split.train_n, step, o.batch_size, o.seed);
    std::mt19937_64 rng(o.seed * 0xBF58476D1CE4E5B9ull + static_cast<uint64_t>(step));
    Batch b = MakeBatch(records, l_d, o.position_fraction, rng);
    accounting.Begin(step);
    double step_loss = std::nan("");
    if (!b.rows.empty()) {
      step_loss = MeanSlotLoss(RunSlots(*model, SlotStates(*model, *target, b), b.targets, true));
    }
    RETURN_IF_ERROR(accounting.Finish(step, step_loss, b.rows.empty() ? 0 : 1, b.record_tokens));
    if (step == 0) result.first_loss = step_loss;
    result.tokens_seen += b.record_tokens;
    if (auto mean = accounting.Log(step, "", step + 1 == total)) result.last_loss = *mean;
    return OkStatus();
  };
  auto evaluate_and_log = [&](int64_t done) {
    evaluate();
    if (!o.quiet) {
      std::fprintf(stderr, "step %ld | val loss %.4f | val top-1 by slot [%s]\n", done,
                   result.val_loss, FormatValues(result.val_slot_accuracy).c_str());
    }
  };
  RETURN_IF_ERROR(RunStepLoop(o, start_step, split.val_n > 0,
                              {.train = train_step,
                               .evaluate = evaluate_and_log,
                               .save_checkpoint = save_checkpoint,
                               .save_final =
                                   [&] {
                                     model->eval();
                                     return SaveSpecFormerDir(*model, o.out_dir);
                                   }},
                              &result));
  return result;
}

}  // namespace specula
