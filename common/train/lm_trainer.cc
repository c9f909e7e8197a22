#include "common/train/lm_trainer.h"

#include "common/train/adamw.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "common/model/checkpoint.h"
#include "common/model/model_runner.h"
#include "common/model/transformer.h"
#include "common/train/train_progress.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// [B, T + 1] windows starting at the given offsets.
torch::Tensor Windows(const TokenFile& tokens, const std::vector<int64_t>& starts, int64_t len) {
  auto out = torch::empty({static_cast<int64_t>(starts.size()), len}, torch::kLong);
  auto acc = out.accessor<int64_t, 2>();
  for (size_t b = 0; b < starts.size(); ++b) {
    for (int64_t t = 0; t < len; ++t) acc[b][t] = tokens[starts[b] + t];
  }
  return out;
}

// Mean next-token loss of `model` on windows [B, T + 1].
torch::Tensor WindowLoss(CausalLMImpl& model, const torch::Tensor& windows) {
  const int64_t B = windows.size(0), T = windows.size(1) - 1;
  auto inputs = windows.narrow(1, 0, T).reshape({B * T});
  auto targets = windows.narrow(1, 1, T).reshape({B * T});
  auto positions = torch::arange(T, torch::kLong).repeat({B});
  AttentionInputs in = model.DenseCausalInputs(B, T, positions);
  auto out = model.forward(inputs, in, nullptr);
  auto logits = model.Logits(out.last_hidden).to(torch::kFloat);
  return torch::nn::functional::cross_entropy(logits, targets);
}

double EvaluateLoss(CausalLMImpl& model, const TokenFile& tokens, int64_t seq_len, int64_t batch,
                    int64_t max_windows) {
  torch::NoGradGuard no_grad;
  const int64_t available = (tokens.size() - 1) / seq_len;
  const int64_t windows = max_windows > 0 ? std::min(available, max_windows) : available;
  if (windows <= 0) return std::nan("");
  // Evenly spaced non-overlapping windows: deterministic and spread over the whole file.
  const int64_t stride = available / windows;
  double total = 0;
  int64_t count = 0;
  for (int64_t w = 0; w < windows; w += batch) {
    std::vector<int64_t> starts;
    for (int64_t i = w; i < std::min(windows, w + batch); ++i)
      starts.push_back(i * stride * seq_len);
    auto loss = WindowLoss(model, Windows(tokens, starts, seq_len + 1));
    total += loss.item<double>() * starts.size();
    count += starts.size();
  }
  return total / count;
}

// LoadWeightsInto shares memory with the mapped file; training writes, so take real copies.
void TakeOwnedCopies(CausalLMImpl& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) p.value().set_data(p.value().clone());
}

}  // namespace

StatusOr<LmTrainResult> TrainLanguageModel(const ModelConfig& config, const LmTrainOptions& o) {
  RETURN_IF_ERROR(config.Validate("model config"));
  if (o.out_dir.empty()) return InvalidArgumentError("out_dir is required");
  if (o.batch_size <= 0 || o.seq_len <= 0 || o.grad_accum <= 0) {
    return InvalidArgumentError("batch_size, seq_len and grad_accum must be positive");
  }
  if (o.seq_len > config.max_position_embeddings) {
    return InvalidArgumentError(StrCat("seq_len ", o.seq_len, " exceeds max_position_embeddings ",
                                       config.max_position_embeddings));
  }
  ASSIGN_OR_RETURN(TokenFile train, TokenFile::Open(o.train_tokens));
  if (train.size() <= o.seq_len + 1)
    return InvalidArgumentError(StrCat(o.train_tokens, ": too few tokens"));
  std::optional<TokenFile> val;
  if (!o.val_tokens.empty()) {
    ASSIGN_OR_RETURN(TokenFile v, TokenFile::Open(o.val_tokens));
    val = std::move(v);
  }
  for (int64_t i = 0; i < train.size(); i += 4096) {
    if (train[i] >= config.vocab_size) {
      return InvalidArgumentError(
          StrCat(o.train_tokens, ": token ", train[i], " >= vocab_size ", config.vocab_size));
    }
  }

  torch::manual_seed(o.seed);
  auto model = std::make_shared<CausalLMImpl>(config);
  model->InitWeights(o.seed, o.depth_scaled_init);
  if (!o.init_from.empty()) {
    RETURN_IF_ERROR(LoadWeightsInto(*model, o.init_from).WithContext("init_from"));
    TakeOwnedCopies(*model);
  }
  model->train();

  std::unique_ptr<torch::optim::AdamW> adamw = MakeAdamW(*model, {.lr = o.lr.peak_lr,
                                                                  .beta1 = o.beta1,
                                                                  .beta2 = o.beta2,
                                                                  .eps = o.adam_eps,
                                                                  .weight_decay = o.weight_decay});
  torch::optim::AdamW& optimizer = *adamw;

  const fs::path ckpt_dir = fs::path(o.out_dir) / "checkpoint";
  int64_t start_step = 0;
  LmTrainResult result;
  result.last_val_loss = std::nan("");
  if (o.resume && fs::exists(ckpt_dir / "state.json")) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString((ckpt_dir / "state.json").string()));
    auto state = nlohmann::json::parse(text, nullptr, false);
    if (state.is_discarded() || !state.contains("step")) {
      return DataLossError(StrCat((ckpt_dir / "state.json").string(), ": malformed"));
    }
    RETURN_IF_ERROR(LoadWeightsInto(*model, ckpt_dir.string()));
    TakeOwnedCopies(*model);
    try {
      torch::load(optimizer, (ckpt_dir / "optimizer.pt").string());
    } catch (const c10::Error& e) {
      return DataLossError(StrCat("cannot load optimizer state: ", e.what_without_backtrace()));
    }
    start_step = state["step"].get<int64_t>();
    result.tokens_seen = state.value("tokens_seen", int64_t{0});
    if (!o.quiet) std::fprintf(stderr, "resuming from step %ld\n", start_step);
  }

  auto save_checkpoint = [&](int64_t step) -> Status {
    fs::create_directories(ckpt_dir);
    RETURN_IF_ERROR(SaveModelDir(*model, config, ckpt_dir.string()));
    try {
      torch::save(optimizer, (ckpt_dir / "optimizer.pt").string());
    } catch (const c10::Error& e) {
      return InternalError(StrCat("cannot save optimizer: ", e.what_without_backtrace()));
    }
    nlohmann::json state = {{"step", step}, {"tokens_seen", result.tokens_seen}, {"seed", o.seed}};
    return WriteStringToFile((ckpt_dir / "state.json").string(), state.dump(2) + "\n");
  };

  const int64_t total = o.lr.total_steps;
  const int64_t tokens_per_step = o.batch_size * o.grad_accum * o.seq_len;
  auto t_start = Clock::now();
  int64_t steps_this_run = 0;
  double loss_acc = 0;
  int64_t loss_count = 0;
  int64_t step = start_step;
  for (; step < total; ++step) {
    // Windows for this step depend only on (seed, step): resume-safe.
    std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step));
    std::uniform_int_distribution<int64_t> offset(0, train.size() - o.seq_len - 2);
    for (auto& group : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(o.lr.At(step));
    }
    optimizer.zero_grad();
    double step_loss = 0;
    for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
      std::vector<int64_t> starts(o.batch_size);
      for (auto& s : starts) s = offset(rng);
      auto loss = WindowLoss(*model, Windows(train, starts, o.seq_len + 1)) /
                  static_cast<double>(o.grad_accum);
      loss.backward();
      step_loss += loss.item<double>();
    }
    if (!std::isfinite(step_loss))
      return InternalError(StrCat("loss became ", step_loss, " at step ", step));
    if (o.grad_clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), o.grad_clip);
    optimizer.step();
    result.tokens_seen += tokens_per_step;
    result.last_train_loss = step_loss;
    loss_acc += step_loss;
    ++loss_count;
    ++steps_this_run;

    const int64_t done = step + 1;
    if (!o.quiet && (done % o.log_every == 0 || done == total)) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
      std::fprintf(stderr, "%s\n",
                   ProgressLine(done, total, "", loss_acc / loss_count, o.lr.At(step),
                                steps_this_run * tokens_per_step, steps_this_run, elapsed)
                       .c_str());
      loss_acc = 0;
      loss_count = 0;
    }
    if (val && o.eval_every > 0 && (done % o.eval_every == 0 || done == total)) {
      model->eval();
      result.last_val_loss =
          EvaluateLoss(*model, *val, o.seq_len, o.batch_size, o.eval_batches * o.batch_size);
      model->train();
      if (!o.quiet) {
        std::fprintf(stderr, "step %ld | val loss %.4f | val ppl %.2f\n", done,
                     result.last_val_loss, std::exp(result.last_val_loss));
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
  result.steps_done = step;
  result.finished = step >= total;
  if (result.finished) {
    model->eval();
    RETURN_IF_ERROR(SaveModelDir(*model, config, o.out_dir));
    RETURN_IF_ERROR(save_checkpoint(step));
  }
  return result;
}

StatusOr<double> EvaluateModelLoss(const std::string& model_dir, const std::string& tokens_path,
                                   int64_t seq_len, int64_t batch_size, int64_t max_windows) {
  ASSIGN_OR_RETURN(auto runner,
                   ModelRunner::Load(model_dir, ModelRunnerOptions{.kv = {.num_blocks = 1}}));
  ASSIGN_OR_RETURN(TokenFile tokens, TokenFile::Open(tokens_path));
  auto model = runner->module();
  const double loss = EvaluateLoss(*model, tokens, seq_len, batch_size, max_windows);
  if (std::isnan(loss))
    return InvalidArgumentError(StrCat(tokens_path, ": fewer tokens than one window"));
  return loss;
}

}  // namespace specula
