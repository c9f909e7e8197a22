#include "common/train/specdec_trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "common/drafters/specdec/specdec_model.h"
#include "common/train/drafter_train_data.h"
#include "common/train/glancing.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

// A padded batch of records with `S` drafts each.
struct Batch {
  torch::Tensor tokens;         // [B, T] int64, right-padded with 0
  torch::Tensor split;          // [B, S] int64: the last prefix position p of each draft
  std::vector<int64_t> labels;  // [B * S * k]: x_{p+1+j}, -1 past the record (or no response)
  int64_t B = 0, T = 0, S = 0, k = 0;
  int64_t record_tokens = 0;
};

Batch MakeBatch(const std::vector<TrainRecord>& records, int64_t S, int64_t k,
                std::mt19937_64& rng) {
  Batch b;
  b.B = static_cast<int64_t>(records.size());
  b.S = S;
  b.k = k;
  for (const auto& r : records) b.T = std::max<int64_t>(b.T, r.tokens.size());
  b.tokens = torch::zeros({b.B, b.T}, torch::kLong);
  b.split = torch::zeros({b.B, S}, torch::kLong);
  auto tok = b.tokens.accessor<int64_t, 2>();
  auto split = b.split.accessor<int64_t, 2>();
  b.labels.assign(static_cast<size_t>(b.B * S * k), -1);
  for (int64_t i = 0; i < b.B; ++i) {
    const TrainRecord& r = records[i];
    const int64_t n = static_cast<int64_t>(r.tokens.size());
    b.record_tokens += n;
    for (int64_t t = 0; t < n; ++t) tok[i][t] = r.tokens[t];
    const int64_t lo = std::max<int64_t>(0, r.prompt_len - 1), hi = n - 2;
    if (hi < lo) continue;  // no response token to predict: all labels stay -1
    std::uniform_int_distribution<int64_t> pick(lo, hi);
    for (int64_t s = 0; s < S; ++s) {
      const int64_t p = pick(rng);
      split[i][s] = p;
      for (int64_t j = 0; j < k && p + 1 + j < n; ++j) {
        b.labels[static_cast<size_t>((i * S + s) * k + j)] = r.tokens[p + 1 + j];
      }
    }
  }
  return b;
}

torch::Tensor AllMasked(const Batch& b) { return torch::full({b.B, b.S, b.k}, -1, torch::kLong); }

// Glancing: the first pass's argmax, then GlancingReveal per draft. [B, S, k] int64.
torch::Tensor Glance(SpecDecImpl& model, const Batch& b, double ratio, std::mt19937_64& rng) {
  if (ratio <= 0) return AllMasked(b);
  torch::Tensor predicted;
  {
    torch::NoGradGuard no_grad;
    predicted = model.TrainLogits(b.tokens, b.split, AllMasked(b)).argmax(-1).reshape({-1});
  }
  const auto pred = predicted.accessor<int64_t, 1>();
  std::vector<int64_t> revealed;
  revealed.reserve(b.labels.size());
  for (int64_t d = 0; d < b.B * b.S; ++d) {
    std::vector<int64_t> p(b.k), gold(b.k);
    for (int64_t j = 0; j < b.k; ++j) {
      p[j] = pred[d * b.k + j];
      gold[j] = b.labels[static_cast<size_t>(d * b.k + j)];
    }
    const std::vector<int64_t> r = GlancingReveal(p, gold, ratio, rng);
    revealed.insert(revealed.end(), r.begin(), r.end());
  }
  return torch::tensor(revealed, torch::kLong).view({b.B, b.S, b.k});
}

// CE targets: the labels of slots not revealed, -100 (ignored) elsewhere. [B * S * k].
torch::Tensor LossTargets(const Batch& b, const torch::Tensor& revealed) {
  const torch::Tensor labels = torch::tensor(b.labels, torch::kLong);
  const torch::Tensor keep = labels.ge(0).logical_and(revealed.reshape({-1}).lt(0));
  return torch::where(keep, labels, torch::full_like(labels, -100));
}

}  // namespace

StatusOr<SpecDecTrainResult> TrainSpecDec(const SpecDecTrainOptions& o) {
  RETURN_IF_ERROR(ValidateDrafterTrainOptions(o));
  if (o.splits_per_record < 1) {
    return InvalidArgumentError(
        StrCat("splits_per_record must be at least 1, got ", o.splits_per_record));
  }
  if (!(o.glancing_ratio >= 0 && o.glancing_ratio <= 1)) {
    return InvalidArgumentError(StrCat("glancing_ratio must be in [0, 1], got ", o.glancing_ratio));
  }
  if (!(o.label_smoothing >= 0 && o.label_smoothing < 1)) {
    return InvalidArgumentError(
        StrCat("label_smoothing must be in [0, 1), got ", o.label_smoothing));
  }
  ASSIGN_OR_RETURN(ModelConfig tc,
                   ModelConfig::FromFile((fs::path(o.target_dir) / "config.json").string()));
  SpecDecConfig config = SpecDecConfig::ForTarget(tc);
  config.target.model = o.target_dir;
  config.hidden_size = o.hidden_size;
  config.encoder_layers = o.encoder_layers;
  config.decoder_layers = o.decoder_layers;
  config.num_slots = o.num_slots;
  config.geometry.num_attention_heads = o.num_attention_heads;
  config.geometry.num_key_value_heads = o.num_key_value_heads;
  config.geometry.head_dim = o.head_dim;
  config.geometry.intermediate_size = o.intermediate_size;
  RETURN_IF_ERROR(config.Validate("SpecDec config"));
  const int64_t k = config.num_slots;

  ASSIGN_OR_RETURN(RecordSource source,
                   RecordSource::Open(o, tc.vocab_size, MaxRecordLength(o, tc)));
  ASSIGN_OR_RETURN(const RecordSplit split, SplitRecords(source, o.val_records));

  torch::manual_seed(o.seed);
  auto model = std::make_shared<SpecDecImpl>(config, tc);
  model->InitWeights(o.seed);
  SpecDecTrainResult result;
  if (!o.init_encoder_from.empty()) {
    ASSIGN_OR_RETURN(result.encoder_layers_initialised,
                     model->InitEncoderFrom(o.init_encoder_from));
  }
  model->train();
  std::unique_ptr<torch::optim::AdamW> adamw = MakeDrafterAdamW(*model, o);
  torch::optim::AdamW& optimizer = *adamw;

  result.parameters = config.parameters();
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
    RETURN_IF_ERROR(SaveSpecDecDir(*model, ckpt_dir.string()));
    return SaveCheckpointState(ckpt_dir, optimizer,
                               {{"step", step},
                                {"tokens_seen", result.tokens_seen},
                                {"first_loss", result.first_loss},
                                {"seed", o.seed}});
  };

  auto evaluate = [&]() {
    torch::NoGradGuard no_grad;
    model->eval();
    std::vector<double> loss(k, 0), correct(k, 0), count(k, 0);
    std::mt19937_64 rng(o.seed + 7);  // the same validation drafts at every evaluation
    for (const auto& records : ValidationBatches(source, split.train_n, o.batch_size)) {
      const Batch b = MakeBatch(records, o.splits_per_record, k, rng);
      const torch::Tensor logits =
          model->TrainLogits(b.tokens, b.split, AllMasked(b)).reshape({-1, k, tc.vocab_size});
      const torch::Tensor labels = torch::tensor(b.labels, torch::kLong).view({-1, k});
      for (int64_t j = 0; j < k; ++j) {
        const torch::Tensor target = labels.select(1, j);
        const torch::Tensor valid = target.ge(0);
        const int64_t n = valid.sum().item<int64_t>();
        if (n == 0) continue;
        const torch::Tensor rows = logits.select(1, j).index({valid});
        const torch::Tensor gold = target.index({valid});
        loss[j] +=
            torch::nn::functional::cross_entropy(
                rows, gold, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                .item<double>();
        correct[j] += rows.argmax(-1).eq(gold).sum().item<double>();
        count[j] += static_cast<double>(n);
      }
    }
    model->train();
    result.val_slot_loss.assign(k, std::nan(""));
    result.val_slot_accuracy.assign(k, std::nan(""));
    double total = 0;
    int64_t slots = 0;
    for (int64_t j = 0; j < k; ++j) {
      if (count[j] == 0) continue;
      result.val_slot_loss[j] = loss[j] / count[j];
      result.val_slot_accuracy[j] = correct[j] / count[j];
      total += result.val_slot_loss[j];
      ++slots;
    }
    result.val_loss = slots ? total / slots : std::nan("");
  };

  const int64_t total = o.lr.total_steps;
  StepAccounting accounting(o, optimizer, *model);
  auto train_step = [&](int64_t step) -> Status {
    std::vector<TrainRecord> records =
        StepRecords(source, split.train_n, step, o.batch_size, o.seed);
    std::mt19937_64 rng(o.seed * 0xBF58476D1CE4E5B9ull + static_cast<uint64_t>(step));
    const Batch b = MakeBatch(records, o.splits_per_record, k, rng);
    accounting.Begin(step);
    const torch::Tensor revealed =
        Glance(*model, b, GlancingRatio(o.glancing_ratio, step, total), rng);
    const torch::Tensor targets = LossTargets(b, revealed);
    const int64_t n = targets.ge(0).sum().item<int64_t>();
    double step_loss = std::nan("");
    if (n > 0) {
      const torch::Tensor logits =
          model->TrainLogits(b.tokens, b.split, revealed).reshape({-1, tc.vocab_size});
      const torch::Tensor loss = torch::nn::functional::cross_entropy(
          logits, targets,
          torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).label_smoothing(
              o.label_smoothing));
      loss.backward();
      step_loss = loss.item<double>();
    }
    RETURN_IF_ERROR(accounting.Finish(step, step_loss, n, b.record_tokens));
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
                                     return SaveSpecDecDir(*model, o.out_dir);
                                   }},
                              &result));
  return result;
}

}  // namespace specula
