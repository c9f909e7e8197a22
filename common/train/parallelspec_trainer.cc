#include "common/train/parallelspec_trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "common/drafters/parallelspec/parallelspec_model.h"
#include "common/model/model_runner.h"
#include "common/model/transformer.h"
#include "common/train/drafter_train_data.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

// A padded batch with the target's states and the groups trained.
struct Batch {
  torch::Tensor tokens;  // [B, T] int64, right-padded with 0
  int64_t B = 0, T = 0;
  std::vector<int64_t> lengths, prompt_lens;
  torch::Tensor features;  // [B, T, d] the target's feature_layer states (no grad)
  torch::Tensor top;       // [B, T, d] the target's layer-L states (no grad)
  torch::Tensor groups;    // [B, G] int64 group r (padding: 0)
  torch::Tensor valid;     // [B, G] bool
  std::vector<std::vector<int64_t>> group_list;
  int64_t record_tokens = 0;
};

// Row (r, i) predicts x_{r+2+i}: in the loss when that is a response token.
bool InLoss(const Batch& b, int64_t record, int64_t r, int64_t i) {
  const int64_t t = r + 2 + i;
  return t < b.lengths[record] && t >= b.prompt_lens[record];
}

Batch MakeBatch(CausalLMImpl& target, const std::vector<TrainRecord>& records,
                int64_t feature_layer, int64_t k, double group_fraction, std::mt19937_64* rng,
                const std::vector<std::vector<int64_t>>* fixed_groups = nullptr) {
  Batch b;
  b.B = static_cast<int64_t>(records.size());
  for (const auto& r : records) b.T = std::max<int64_t>(b.T, r.tokens.size());
  b.tokens = torch::zeros({b.B, b.T}, torch::kLong);
  auto acc = b.tokens.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b.B; ++i) {
    const TrainRecord& r = records[i];
    for (size_t t = 0; t < r.tokens.size(); ++t) acc[i][t] = r.tokens[t];
    b.lengths.push_back(static_cast<int64_t>(r.tokens.size()));
    b.prompt_lens.push_back(r.prompt_len);
    b.record_tokens += static_cast<int64_t>(r.tokens.size());
  }
  // Groups: those with a row in the loss (every one, or a random share).
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  b.group_list.resize(b.B);
  int64_t G = 0;
  for (int64_t i = 0; i < b.B; ++i) {
    if (fixed_groups) {
      b.group_list[i] = (*fixed_groups)[i];
    } else {
      for (int64_t r = 0; r + 2 < b.lengths[i]; ++r) {
        bool eligible = false;
        for (int64_t m = 1; m <= k && !eligible; ++m) eligible = InLoss(b, i, r, m);
        if (!eligible) continue;
        if (group_fraction >= 1.0 || uniform(*rng) < group_fraction) b.group_list[i].push_back(r);
      }
    }
    G = std::max<int64_t>(G, b.group_list[i].size());
  }
  b.groups = torch::zeros({b.B, G}, torch::kLong);
  b.valid = torch::zeros({b.B, G}, torch::kBool);
  for (int64_t i = 0; i < b.B; ++i) {
    for (size_t g = 0; g < b.group_list[i].size(); ++g) {
      b.groups[i][g] = b.group_list[i][g];
      b.valid[i][g] = true;
    }
  }
  torch::NoGradGuard no_grad;
  const int64_t L = target.config().num_hidden_layers;
  auto positions = torch::arange(b.T, torch::kLong).repeat({b.B});
  AttentionInputs in = target.DenseCausalInputs(b.B, b.T, positions);
  auto out = target.forward(b.tokens.reshape({b.B * b.T}), in, nullptr, {feature_layer});
  b.features = out.hidden_states[0].view({b.B, b.T, -1});
  b.top = feature_layer == L ? b.features : out.last_hidden.view({b.B, b.T, -1});
  return b;
}

// The outputs of a batch's rows: h [B, T-1, d] (real rows) and [B, G, k, d] (masks).
ParallelSpecImpl::GroupOutput Forward(ParallelSpecImpl& model, const Batch& b, double noise_std) {
  const int64_t n = b.T - 1;
  auto f = b.features.narrow(1, 0, n);
  if (noise_std > 0) f = f + noise_std * torch::randn_like(f);
  auto x = model.RealInputs(f, b.tokens.narrow(1, 1, n));
  return model.GroupForward(x, b.groups, b.valid);
}

// Per depth (0 = real rows, i = mask i): summed loss, top-1 agreements and rows in the loss.
struct DepthStats {
  std::vector<double> loss, agree, count;
  explicit DepthStats(int64_t k) : loss(k + 1, 0), agree(k + 1, 0), count(k + 1, 0) {}
  // Mean over the real rows + the mean of each mask depth (NaN when no row is in the loss).
  double StepLoss() const {
    double total = 0;
    bool any = false;
    for (size_t j = 0; j < loss.size(); ++j) {
      if (count[j] > 0) {
        total += loss[j] / count[j];
        any = true;
      }
    }
    return any ? total : std::nan("");
  }
};

// The loss of one batch; backpropagated (the sum of per-depth means) when `backward`.
DepthStats Loss(ParallelSpecImpl& model, CausalLMImpl& target, const Batch& b,
                const ParallelSpecImpl::GroupOutput& out, double ce_weight, bool backward) {
  const int64_t k = model.config().num_mask_tokens, d = b.features.size(2);
  const bool regress = model.config().use_target_features;
  // Rows in the loss per depth: (index into the flattened outputs, flat target position).
  std::vector<std::vector<int64_t>> rows(k + 1), targets(k + 1);
  const int64_t n = b.T - 1;
  for (int64_t i = 0; i < b.B; ++i) {
    for (int64_t r = 0; r < n; ++r) {
      if (!InLoss(b, i, r, 0)) continue;
      rows[0].push_back(i * n + r);
      targets[0].push_back(i * b.T + r + 1);
    }
    const int64_t G = b.groups.size(1);
    for (size_t g = 0; g < b.group_list[i].size(); ++g) {
      const int64_t r = b.group_list[i][g];
      for (int64_t m = 1; m <= k; ++m) {
        if (!InLoss(b, i, r, m)) continue;
        rows[m].push_back((i * G + static_cast<int64_t>(g)) * k + (m - 1));
        targets[m].push_back(i * b.T + r + 1 + m);
      }
    }
  }
  auto real = out.real.reshape({-1, d});
  auto masks = out.masks.reshape({-1, d});
  auto features = b.features.reshape({-1, d});
  auto top = b.top.reshape({-1, d});
  DepthStats stats(k);
  torch::Tensor total;
  for (int64_t j = 0; j <= k; ++j) {
    if (rows[j].empty()) continue;
    auto index = torch::tensor(rows[j], torch::kLong);
    auto at = torch::tensor(targets[j], torch::kLong);
    auto h = (j == 0 ? real : masks).index_select(0, index);
    torch::Tensor soft;
    {
      torch::NoGradGuard no_grad;
      soft = torch::softmax(target.Logits(top.index_select(0, at)).to(torch::kFloat), -1);
    }
    auto logits = model.Logits(h).to(torch::kFloat);
    auto per_row = -(soft * torch::log_softmax(logits, -1)).sum(-1);
    if (regress) {
      auto vloss = torch::nn::functional::smooth_l1_loss(
                       h.to(torch::kFloat), features.index_select(0, at).to(torch::kFloat),
                       torch::nn::functional::SmoothL1LossFuncOptions().reduction(torch::kNone))
                       .mean(-1);
      per_row = ce_weight * per_row + vloss;
    }
    auto mean = per_row.mean();
    total = total.defined() ? total + mean : mean;
    torch::NoGradGuard no_grad;
    stats.loss[j] = per_row.sum().item<double>();
    stats.count[j] = static_cast<double>(rows[j].size());
    stats.agree[j] = logits.argmax(-1).eq(soft.argmax(-1)).sum().item<double>();
  }
  if (backward && total.defined()) total.backward();
  return stats;
}

}  // namespace

at::Tensor ParallelSpecTrainingLogits(ParallelSpecImpl& model, CausalLMImpl& target,
                                      const std::vector<int64_t>& tokens,
                                      const std::vector<int64_t>& groups) {
  torch::NoGradGuard no_grad;
  const std::vector<std::vector<int64_t>> fixed = {groups};
  Batch b = MakeBatch(target, {{.tokens = tokens, .prompt_len = 0}}, model.config().feature_layer,
                      model.config().num_mask_tokens, 1.0, nullptr, &fixed);
  auto out = Forward(model, b, 0.0);
  std::vector<torch::Tensor> rows;
  for (size_t g = 0; g < groups.size(); ++g) {
    rows.push_back(torch::cat({out.real[0].narrow(0, groups[g], 1), out.masks[0][g]}, 0));
  }
  return model.Logits(torch::stack(rows, 0)).to(torch::kFloat);
}

StatusOr<ParallelSpecTrainResult> TrainParallelSpec(const ParallelSpecTrainOptions& o) {
  RETURN_IF_ERROR(ValidateDrafterTrainOptions(o));
  if (!(o.group_fraction > 0 && o.group_fraction <= 1)) {
    return InvalidArgumentError(StrCat("group_fraction must be in (0, 1], got ", o.group_fraction));
  }
  if (o.noise_std < 0) {
    return InvalidArgumentError(StrCat("noise_std must be >= 0, got ", o.noise_std));
  }
  if (!(o.ce_weight > 0)) {
    return InvalidArgumentError(StrCat("ce_weight must be positive, got ", o.ce_weight));
  }
  ASSIGN_OR_RETURN(auto runner, LoadFrozenTarget(o.target_dir));
  std::shared_ptr<CausalLMImpl> target = runner->module();
  const ModelConfig& tc = runner->config();

  ParallelSpecConfig config = ParallelSpecConfig::ForTarget(tc, o.num_mask_tokens);
  config.target.model = o.target_dir;
  config.use_target_features = o.use_target_features;
  if (o.intermediate_size > 0) config.intermediate_size = o.intermediate_size;
  RETURN_IF_ERROR(config.Validate("ParallelSpec config"));
  const int64_t k = config.num_mask_tokens;

  ASSIGN_OR_RETURN(RecordSource source,
                   RecordSource::Open(o, tc.vocab_size, MaxRecordLength(o, tc)));
  ASSIGN_OR_RETURN(const RecordSplit split, SplitRecords(source, o.val_records));

  torch::manual_seed(o.seed);
  auto model = std::make_shared<ParallelSpecImpl>(config, tc);
  model->InitWeights(o.seed);
  model->SetTargetWeights(target->model->embed_tokens->weight, target->lm_head_weight());
  model->train();
  std::unique_ptr<torch::optim::AdamW> adamw = MakeDrafterAdamW(*model, o);
  torch::optim::AdamW& optimizer = *adamw;

  ParallelSpecTrainResult result;
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
    RETURN_IF_ERROR(SaveParallelSpecDir(*model, ckpt_dir.string()));
    nlohmann::json state = {{"step", step}, {"tokens_seen", result.tokens_seen}, {"seed", o.seed}};
    if (std::isfinite(result.first_loss)) state["first_loss"] = result.first_loss;
    return SaveCheckpointState(ckpt_dir, optimizer, state);
  };

  auto evaluate = [&]() {
    torch::NoGradGuard no_grad;
    model->eval();
    DepthStats total(k);
    for (const auto& records : ValidationBatches(source, split.train_n, o.batch_size)) {
      Batch b = MakeBatch(*target, records, config.feature_layer, k, 1.0, nullptr);
      if (b.T < 2) continue;
      DepthStats s = Loss(*model, *target, b, Forward(*model, b, 0.0), o.ce_weight, false);
      for (int64_t j = 0; j <= k; ++j) {
        total.loss[j] += s.loss[j];
        total.agree[j] += s.agree[j];
        total.count[j] += s.count[j];
      }
    }
    model->train();
    result.val_loss = total.StepLoss();
    result.val_top1.assign(k + 1, std::nan(""));
    for (int64_t j = 0; j <= k; ++j) {
      if (total.count[j] > 0) result.val_top1[j] = total.agree[j] / total.count[j];
    }
  };

  const int64_t total_steps = o.lr.total_steps;
  StepAccounting accounting(o, optimizer, *model);
  auto train_step = [&](int64_t step) -> Status {
    std::vector<TrainRecord> records =
        StepRecords(source, split.train_n, step, o.batch_size, o.seed);
    const uint64_t step_seed = o.seed * 0xBF58476D1CE4E5B9ull + static_cast<uint64_t>(step);
    std::mt19937_64 rng(step_seed);
    torch::manual_seed(step_seed);  // the feature noise
    Batch b = MakeBatch(*target, records, config.feature_layer, k, o.group_fraction, &rng);
    accounting.Begin(step);
    double loss = std::nan("");
    int64_t count = 0;
    if (b.T >= 2) {
      DepthStats s = Loss(*model, *target, b, Forward(*model, b, o.noise_std), o.ce_weight, true);
      loss = s.StepLoss();
      for (double c : s.count) count += static_cast<int64_t>(c);
    }
    RETURN_IF_ERROR(accounting.Finish(step, loss, count, b.record_tokens));
    if (step == 0) result.first_loss = loss;
    result.tokens_seen += b.record_tokens;
    if (auto mean = accounting.Log(step, "", step + 1 == total_steps)) result.last_loss = *mean;
    return OkStatus();
  };
  auto evaluate_and_log = [&](int64_t done) {
    evaluate();
    if (!o.quiet) {
      std::fprintf(stderr, "step %ld | val loss %.4f | val top-1 by depth [%s]\n", done,
                   result.val_loss, FormatValues(result.val_top1).c_str());
    }
  };
  RETURN_IF_ERROR(RunStepLoop(o, start_step, split.val_n > 0,
                              {.train = train_step,
                               .evaluate = evaluate_and_log,
                               .save_checkpoint = save_checkpoint,
                               .save_final =
                                   [&] {
                                     model->eval();
                                     return SaveParallelSpecDir(*model, o.out_dir);
                                   }},
                              &result));
  return result;
}

}  // namespace specula
