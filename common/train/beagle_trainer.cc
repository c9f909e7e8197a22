#include "common/train/beagle_trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "common/drafters/beagle/beagle_model.h"
#include "common/model/model_runner.h"
#include "common/model/transformer.h"
#include "common/train/beagle_masks.h"
#include "common/train/drafter_train_data.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

// A padded batch, its window offsets and the target's states.
struct Batch {
  torch::Tensor tokens;  // [B, T] int64, right-padded with 0
  int64_t B = 0, T = 0;
  std::vector<int64_t> lengths, prompt_lens, eps;
  torch::Tensor states;     // [B * T, d] the target's top hidden states (no grad)
  torch::Tensor positions;  // [B * T] t of each row
  int64_t record_tokens = 0;
};

Batch MakeBatch(CausalLMImpl& target, const std::vector<TrainRecord>& records,
                std::vector<int64_t> eps) {
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
  b.eps = std::move(eps);
  b.positions = torch::arange(b.T, torch::kLong).repeat({b.B});
  torch::NoGradGuard no_grad;
  AttentionInputs in = target.DenseCausalInputs(b.B, b.T, b.positions);
  // last_hidden = hidden layer L (after the final norm).
  b.states = target.forward(b.tokens.reshape({b.B * b.T}), in, nullptr).last_hidden;
  return b;
}

// The query at t is in the loss when it predicts a response token.
bool InLoss(const Batch& b, int64_t r, int64_t t) {
  return t + 1 >= b.prompt_lens[r] && t + 1 < b.lengths[r];
}

// One set of queries over a batch: per record its positions (padded to F) and mask rows over
// Tk keys.
struct Queries {
  int64_t F = 0;
  torch::Tensor positions;              // [B, F] int64 (0 where padded)
  torch::Tensor mask;                   // [B, F, Tk] bool
  torch::Tensor run_index;              // [Q] flat b * F + f of the real queries
  torch::Tensor run_rows;               // [Q] their batch rows b * T + t
  torch::Tensor loss_index, loss_rows;  // the same for the queries in the loss
};

// `positions[r]` ascending, `masks[r]` [T x Tk] (beagle_masks.h).
Queries MakeQueries(const Batch& b, const std::vector<std::vector<int64_t>>& positions,
                    const std::vector<std::vector<uint8_t>>& masks, int64_t Tk) {
  Queries q;
  for (const auto& p : positions) q.F = std::max<int64_t>(q.F, p.size());
  q.positions = torch::zeros({b.B, q.F}, torch::kLong);
  q.mask = torch::zeros({b.B, q.F, Tk}, torch::kBool);
  std::vector<int64_t> run_index, run_rows, loss_index, loss_rows;
  for (int64_t r = 0; r < b.B; ++r) {
    const auto& pos = positions[r];
    if (pos.empty()) continue;
    auto index = torch::tensor(pos, torch::kLong);
    q.positions[r].narrow(0, 0, index.size(0)).copy_(index);
    auto full = torch::from_blob(const_cast<uint8_t*>(masks[r].data()), {b.T, Tk}, torch::kUInt8);
    q.mask[r].narrow(0, 0, index.size(0)).copy_(full.index_select(0, index).to(torch::kBool));
    for (size_t f = 0; f < pos.size(); ++f) {
      run_index.push_back(r * q.F + static_cast<int64_t>(f));
      run_rows.push_back(r * b.T + pos[f]);
      if (InLoss(b, r, pos[f])) {
        loss_index.push_back(run_index.back());
        loss_rows.push_back(run_rows.back());
      }
    }
  }
  q.run_index = torch::tensor(run_index, torch::kLong);
  q.run_rows = torch::tensor(run_rows, torch::kLong);
  q.loss_index = torch::tensor(loss_index, torch::kLong);
  q.loss_rows = torch::tensor(loss_rows, torch::kLong);
  return q;
}

// Early stage: every query in the loss, under the inverse block mask.
Queries EarlyQueries(const Batch& b, int64_t k) {
  std::vector<std::vector<int64_t>> positions(b.B);
  std::vector<std::vector<uint8_t>> masks(b.B);
  for (int64_t r = 0; r < b.B; ++r) {
    for (int64_t t = 0; t < b.lengths[r]; ++t) {
      if (InLoss(b, r, t) && BeagleWindowOf(t, k, b.eps[r]).start >= 0) positions[r].push_back(t);
    }
    masks[r] = BeagleEarlyMask(b.T, k, b.eps[r]);
  }
  return MakeQueries(b, positions, masks, b.T);
}

// Late stage, simulation step i: every real query at window position i (those outside the loss
// still write their drafted state for the later steps).
Queries LateQueries(const Batch& b, int64_t k, int64_t step) {
  std::vector<std::vector<int64_t>> positions(b.B);
  std::vector<std::vector<uint8_t>> masks(b.B);
  for (int64_t r = 0; r < b.B; ++r) {
    for (int64_t t : BeagleStepQueries(b.T, k, b.eps[r], step)) {
      if (t < b.lengths[r]) positions[r].push_back(t);
    }
    masks[r] = BeagleLateMask(b.T, k, b.eps[r], step);
  }
  return MakeQueries(b, positions, masks, 2 * b.T);
}

// Keys and values [B, T, Hkv, dh] of states [B * T, d].
std::pair<torch::Tensor, torch::Tensor> KeysValues(BeagleImpl& model, const Batch& b,
                                                   const torch::Tensor& states) {
  auto [k, v] = model.KeysValues(states, b.positions);
  return {k.view({b.B, b.T, k.size(1), k.size(2)}), v.view({b.B, b.T, v.size(1), v.size(2)})};
}

// h [B * F, d] of a query set against keys/values [B, Tk, Hkv, dh].
torch::Tensor RunQueries(BeagleImpl& model, const Batch& b, const Queries& q,
                         const torch::Tensor& k, const torch::Tensor& v) {
  const auto& c = model.config();
  auto query =
      model.Query(b.tokens.gather(1, q.positions).reshape({-1}), q.positions.reshape({-1}));
  auto attn = BeagleCrossAttention(query.q.view({b.B, q.F, c.num_attention_heads, c.head_dim}), k,
                                   v, q.mask);
  return model.Output(query.residual, attn.reshape({b.B * q.F, -1}));
}

struct QueryLoss {
  torch::Tensor per_query;  // [R] CE + vloss_weight * SmoothL1
  int64_t agree = 0;        // top-1 equal to the target's argmax
};

// Losses of drafted states h [R, d] against the target's states H [R, d] at the same positions.
QueryLoss Loss(BeagleImpl& model, CausalLMImpl& target, const torch::Tensor& h,
               const torch::Tensor& H, double vloss_weight) {
  torch::Tensor soft;
  {
    torch::NoGradGuard no_grad;
    soft = torch::softmax(target.Logits(H).to(torch::kFloat), -1);
  }
  auto logits = model.Logits(h).to(torch::kFloat);
  auto ce = -(soft * torch::log_softmax(logits, -1)).sum(-1);
  auto vloss = torch::nn::functional::smooth_l1_loss(
                   h.to(torch::kFloat), H.to(torch::kFloat),
                   torch::nn::functional::SmoothL1LossFuncOptions().reduction(torch::kNone))
                   .mean(-1);
  QueryLoss out{.per_query = ce + vloss_weight * vloss};
  torch::NoGradGuard no_grad;
  out.agree = logits.argmax(-1).eq(soft.argmax(-1)).sum().item<int64_t>();
  return out;
}

// Loss weight of simulation step i (1..s): (k - i + 1) / sum_{i'=1..s} (k - i' + 1).
double StepWeight(int64_t k, int64_t s, int64_t i) {
  double total = 0;
  for (int64_t j = 1; j <= s; ++j) total += static_cast<double>(k - j + 1);
  return static_cast<double>(k - i + 1) / total;
}

// Early stage on a batch: the mean loss over its eligible queries (and their count),
// backpropagated when `backward`.
struct BatchLoss {
  double loss = std::nan("");
  int64_t count = 0;
};
BatchLoss EarlyStep(BeagleImpl& model, CausalLMImpl& target, const Batch& b, int64_t k,
                    double noise_std, double vloss_weight, bool backward) {
  Queries q = EarlyQueries(b, k);
  if (q.loss_rows.numel() == 0) return {};
  auto states = noise_std > 0 ? b.states + noise_std * torch::randn_like(b.states) : b.states;
  auto [kk, vv] = KeysValues(model, b, states);
  auto h = RunQueries(model, b, q, kk, vv).index_select(0, q.loss_index);
  auto loss =
      Loss(model, target, h, b.states.index_select(0, q.loss_rows), vloss_weight).per_query.mean();
  if (backward) loss.backward();
  return {loss.item<double>(), q.loss_rows.numel()};
}

// Per simulation step: summed query loss, top-1 agreement and query count.
struct SimulationStats {
  std::vector<double> loss, agree, count;
  explicit SimulationStats(int64_t steps) : loss(steps, 0), agree(steps, 0), count(steps, 0) {}
};

// Late stage on a batch: `steps` simulation steps. With `backward`, each step's mean loss is
// backpropagated at once with its StepWeight (true keys' gradient accumulated, see the header).
SimulationStats Simulate(BeagleImpl& model, CausalLMImpl& target, const Batch& b, int64_t k,
                         int64_t s, int64_t steps, double noise_std, double vloss_weight,
                         bool backward) {
  SimulationStats stats(steps);
  auto states = noise_std > 0 ? b.states + noise_std * torch::randn_like(b.states) : b.states;
  auto [kt, vt] = KeysValues(model, b, states);
  auto kt_leaf = kt.detach().requires_grad_(backward);
  auto vt_leaf = vt.detach().requires_grad_(backward);
  auto predicted = torch::zeros_like(b.states);  // [B * T, d], written in place, no grad
  for (int64_t i = 1; i <= steps; ++i) {
    Queries q = LateQueries(b, k, i);
    if (q.run_rows.numel() == 0) continue;
    auto [kp, vp] = KeysValues(model, b, predicted);
    auto h = RunQueries(model, b, q, torch::cat({kt_leaf, kp}, 1), torch::cat({vt_leaf, vp}, 1));
    if (q.loss_rows.numel() > 0) {
      QueryLoss l = Loss(model, target, h.index_select(0, q.loss_index),
                         b.states.index_select(0, q.loss_rows), vloss_weight);
      if (backward && i <= s) (StepWeight(k, s, i) * l.per_query.mean()).backward();
      stats.loss[i - 1] = l.per_query.sum().item<double>();
      stats.agree[i - 1] = static_cast<double>(l.agree);
      stats.count[i - 1] = static_cast<double>(q.loss_rows.numel());
    }
    predicted.index_copy_(0, q.run_rows, h.detach().index_select(0, q.run_index));
  }
  if (backward && kt_leaf.grad().defined()) {
    torch::autograd::backward({kt, vt}, {kt_leaf.grad(), vt_leaf.grad()});
  }
  return stats;
}

// The weighted late loss of simulation stats (steps 1..s with a query in the loss) and the
// number of those queries.
BatchLoss LateLoss(const SimulationStats& stats, int64_t k, int64_t s) {
  double loss = 0, weight = 0;
  BatchLoss out;
  for (int64_t i = 1; i <= s; ++i) {
    if (stats.count[i - 1] == 0) continue;
    loss += StepWeight(k, s, i) * stats.loss[i - 1] / stats.count[i - 1];
    weight += StepWeight(k, s, i);
    out.count += static_cast<int64_t>(stats.count[i - 1]);
  }
  if (weight > 0) out.loss = loss / weight;
  return out;
}

// The window offsets of a training step's records.
std::vector<int64_t> StepOffsets(uint64_t seed, int64_t step, int64_t records, int64_t k) {
  std::vector<int64_t> eps;
  for (int64_t r = 0; r < records; ++r) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) * 0x10001ull +
                        static_cast<uint64_t>(r) + 11);
    eps.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(k)));
  }
  return eps;
}

double JsonNumber(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : std::nan("");
}

Status ValidateOptions(const BeagleTrainOptions& o) {
  RETURN_IF_ERROR(ValidateDrafterTrainOptions(o));
  if (o.window < 1) return InvalidArgumentError(StrCat("window must be >= 1, got ", o.window));
  if (o.sim_steps < 1 || o.sim_steps > o.window) {
    return InvalidArgumentError(
        StrCat("sim_steps must be in [1, window = ", o.window, "], got ", o.sim_steps));
  }
  if (!(o.early_fraction >= 0 && o.early_fraction <= 1)) {
    return InvalidArgumentError(StrCat("early_fraction must be in [0, 1], got ", o.early_fraction));
  }
  if (!(o.noise_std >= 0)) return InvalidArgumentError("noise_std must be >= 0");
  if (!(o.vloss_weight >= 0)) return InvalidArgumentError("vloss_weight must be >= 0");
  return OkStatus();
}

}  // namespace

StatusOr<BeagleTrainResult> TrainBeagle(const BeagleTrainOptions& o) {
  RETURN_IF_ERROR(ValidateOptions(o));
  ASSIGN_OR_RETURN(auto runner, LoadFrozenTarget(o.target_dir));
  std::shared_ptr<CausalLMImpl> target = runner->module();
  const ModelConfig& tc = runner->config();

  BeagleConfig config = BeagleConfig::ForTarget(tc);
  config.target.model = o.target_dir;
  if (o.intermediate_size > 0) config.intermediate_size = o.intermediate_size;
  RETURN_IF_ERROR(config.Validate("Beagle config"));
  const int64_t k = o.window, s = o.sim_steps;

  ASSIGN_OR_RETURN(RecordSource source,
                   RecordSource::Open(o, tc.vocab_size, MaxRecordLength(o, tc)));
  ASSIGN_OR_RETURN(const RecordSplit split, SplitRecords(source, o.val_records));

  torch::manual_seed(o.seed);
  auto model = std::make_shared<BeagleImpl>(config, tc);
  model->InitWeights(o.seed);
  model->SetTargetWeights(target->model->embed_tokens->weight, target->lm_head_weight());
  model->train();
  std::unique_ptr<torch::optim::AdamW> adamw = MakeDrafterAdamW(*model, o);
  torch::optim::AdamW& optimizer = *adamw;

  const double nan = std::nan("");
  BeagleTrainResult result;
  result.early_first_loss = result.early_last_loss = nan;
  result.late_first_loss = result.late_last_loss = nan;
  result.val_early_loss = result.val_late_loss = nan;
  const int64_t total = o.lr.total_steps;
  result.early_steps = std::llround(o.early_fraction * static_cast<double>(total));
  const fs::path ckpt_dir = fs::path(o.out_dir) / "checkpoint";
  int64_t start_step = 0;
  if (o.resume) {
    ASSIGN_OR_RETURN(std::optional<nlohmann::json> state,
                     ResumeCheckpoint(ckpt_dir, config.ToJson(), *model, optimizer));
    if (state) {
      start_step = (*state)["step"].get<int64_t>();
      result.tokens_seen = state->value("tokens_seen", int64_t{0});
      result.early_first_loss = JsonNumber(*state, "early_first_loss");
      result.early_last_loss = JsonNumber(*state, "early_last_loss");
      result.late_first_loss = JsonNumber(*state, "late_first_loss");
      result.late_last_loss = JsonNumber(*state, "late_last_loss");
      if (!o.quiet) std::fprintf(stderr, "resuming from step %ld\n", start_step);
    }
  }

  auto save_checkpoint = [&](int64_t step) -> Status {
    RETURN_IF_ERROR(SaveBeagleDir(*model, ckpt_dir.string()));
    nlohmann::json state = {{"step", step}, {"tokens_seen", result.tokens_seen}, {"seed", o.seed}};
    const std::pair<const char*, double> losses[] = {{"early_first_loss", result.early_first_loss},
                                                     {"early_last_loss", result.early_last_loss},
                                                     {"late_first_loss", result.late_first_loss},
                                                     {"late_last_loss", result.late_last_loss}};
    for (const auto& [key, value] : losses) {
      if (std::isfinite(value)) state[key] = value;  // JSON has no NaN
    }
    return SaveCheckpointState(ckpt_dir, optimizer, state);
  };

  // Validation: the last val_n records, offset (record index) mod k, clean states.
  auto evaluate = [&]() {
    torch::NoGradGuard no_grad;
    model->eval();
    SimulationStats late(k);
    double early_sum = 0, early_count = 0;
    int64_t index = 0;
    for (const auto& records : ValidationBatches(source, split.train_n, o.batch_size)) {
      std::vector<int64_t> eps;
      for (size_t r = 0; r < records.size(); ++r) eps.push_back(index++ % k);
      Batch b = MakeBatch(*target, records, eps);
      const BatchLoss e = EarlyStep(*model, *target, b, k, 0.0, o.vloss_weight, false);
      if (e.count > 0) {
        early_sum += e.count * e.loss;
        early_count += e.count;
      }
      SimulationStats sim = Simulate(*model, *target, b, k, s, k, 0.0, o.vloss_weight, false);
      for (int64_t i = 0; i < k; ++i) {
        late.loss[i] += sim.loss[i];
        late.agree[i] += sim.agree[i];
        late.count[i] += sim.count[i];
      }
    }
    model->train();
    result.val_early_loss = early_count > 0 ? early_sum / early_count : std::nan("");
    result.val_late_loss = LateLoss(late, k, s).loss;
    result.val_top1.assign(k, std::nan(""));
    for (int64_t i = 0; i < k; ++i) {
      if (late.count[i] > 0) result.val_top1[i] = late.agree[i] / late.count[i];
    }
  };

  StepAccounting accounting(o, optimizer, *model);
  auto train_step = [&](int64_t step) -> Status {
    const bool early = step < result.early_steps;
    std::vector<TrainRecord> records =
        StepRecords(source, split.train_n, step, o.batch_size, o.seed);
    torch::manual_seed(o.seed * 0xBF58476D1CE4E5B9ull + static_cast<uint64_t>(step));  // noise
    Batch b = MakeBatch(*target, records, StepOffsets(o.seed, step, o.batch_size, k));
    accounting.Begin(step);
    const BatchLoss loss =
        early ? EarlyStep(*model, *target, b, k, o.noise_std, o.vloss_weight, true)
              : LateLoss(Simulate(*model, *target, b, k, s, s, o.noise_std, o.vloss_weight, true),
                         k, s);
    RETURN_IF_ERROR(accounting.Finish(step, loss.loss, loss.count, b.record_tokens));
    double& first = early ? result.early_first_loss : result.late_first_loss;
    if (std::isnan(first)) first = loss.loss;
    result.tokens_seen += b.record_tokens;
    const bool stage_end = step + 1 == result.early_steps || step + 1 == total;
    if (auto mean = accounting.Log(step, early ? "early" : "late", stage_end)) {
      (early ? result.early_last_loss : result.late_last_loss) = *mean;
    }
    return OkStatus();
  };
  auto evaluate_and_log = [&](int64_t done) {
    evaluate();
    if (!o.quiet) {
      std::fprintf(
          stderr, "step %ld | val early loss %.4f | val late loss %.4f | val top-1 by depth [%s]\n",
          done, result.val_early_loss, result.val_late_loss, FormatValues(result.val_top1).c_str());
    }
  };
  RETURN_IF_ERROR(RunStepLoop(o, start_step, split.val_n > 0,
                              {.train = train_step,
                               .evaluate = evaluate_and_log,
                               .save_checkpoint = save_checkpoint,
                               .save_final =
                                   [&] {
                                     model->eval();
                                     return SaveBeagleDir(*model, o.out_dir);
                                   }},
                              &result));
  return result;
}

}  // namespace specula
