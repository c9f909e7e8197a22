// specula train-drafter: train a drafter for a frozen target. --kind specformer trains SpecFormer
// by self-distillation (the target's own responses from `specula distill`), or on raw corpus
// continuations with --raw-tokens (the paper's ablation), and writes a drafter checkpoint
// (config.json naming kind and target, model.safetensors, training.json).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/drafters/specformer/specformer_config.h"
#include "common/model/model_config.h"
#include "common/train/specformer_trainer.h"
#include "common/util/mapped_file.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"

namespace specula::cli {
namespace {

constexpr char kCommand[] = "train-drafter";

struct Flags {
  std::string kind = "specformer";
  SpecFormerTrainOptions train;
  int64_t threads = 0, seed = 0;
  std::vector<int64_t> hidden_layers;
};

Status Run(Flags f, const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  if (f.kind != kSpecFormerKind) {
    return InvalidArgumentError(
        StrCat("--kind: unknown drafter kind '", f.kind, "' (trainable: specformer)"));
  }
  if (f.train.target_dir.empty()) return InvalidArgumentError("--model (the target) is required");
  if (f.train.out_dir.empty()) return InvalidArgumentError("--out is required");
  if (f.threads > 0) SetThreads(f.threads);
  f.train.seed = static_cast<uint64_t>(f.seed);
  f.train.hidden_layers = f.hidden_layers;
  ASSIGN_OR_RETURN(ModelConfig target,
                   ModelConfig::FromFile((fs::path(f.train.target_dir) / "config.json").string()));
  SpecFormerConfig shape = SpecFormerConfig::ForTarget(target, f.train.draft_len);
  if (f.train.intermediate_size > 0) shape.intermediate_size = f.train.intermediate_size;
  if (!f.hidden_layers.empty()) shape.hidden_layers = f.hidden_layers;
  const int64_t shared = shape.shared_parameters(), per_slot = shape.per_slot_parameters();
  const int64_t M = target.num_parameters();
  const double p = 1.0 + static_cast<double>(shared + shape.draft_len * per_slot) / M;
  std::fprintf(
      stderr,
      "training specformer for %s on %s: l_d %ld, %ld params (m_s %ld + l_d x m_p %ld), "
      "target %ld params, p = %.3f, %ld steps of %ld records\n",
      f.train.target_dir.c_str(),
      f.train.raw_tokens.empty() ? f.train.distill_path.c_str() : f.train.raw_tokens.c_str(),
      shape.draft_len, shared + shape.draft_len * per_slot, shared, per_slot, M, p,
      f.train.lr.total_steps, f.train.batch_size);
  ASSIGN_OR_RETURN(SpecFormerTrainResult result, TrainSpecFormer(f.train));
  if (!result.finished) {
    std::fprintf(stderr, "stopped at step %ld of %ld; run the same command again to resume\n",
                 result.steps_done, f.train.lr.total_steps);
    return OkStatus();
  }
  std::string command = "specula train-drafter";
  for (const auto& a : args) command += " " + a;
  nlohmann::json info = {
      {"kind", f.kind},
      {"command", command},
      {"target", f.train.target_dir},
      {"data", f.train.raw_tokens.empty() ? f.train.distill_path : f.train.raw_tokens},
      {"self_distilled", f.train.raw_tokens.empty()},
      {"parameters", {{"shared", shared}, {"per_slot", per_slot}, {"target", M}}},
      {"p", p},
      {"steps", result.steps_done},
      {"tokens_seen", result.tokens_seen},
      {"first_train_loss", result.first_loss},
      {"final_train_loss", result.last_loss},
      {"final_val_loss", result.val_loss},
      {"val_slot_loss", result.val_slot_loss},
      {"val_slot_top1", result.val_slot_accuracy},
      {"seconds_this_run", result.seconds},
      {"seed", f.seed}};
  RETURN_IF_ERROR(WriteStringToFile((fs::path(f.train.out_dir) / "training.json").string(),
                                    info.dump(2) + "\n"));
  std::fprintf(stderr, "done: %s (val loss %.4f)\n", f.train.out_dir.c_str(), result.val_loss);
  return OkStatus();
}

}  // namespace

int RunTrainDrafter(const std::vector<std::string>& args) {
  Flags f;
  SpecFormerTrainOptions& t = f.train;
  t.lr = {.peak_lr = 5e-4, .min_lr = 1e-5, .warmup_steps = 0, .total_steps = 1000};
  double warmup_fraction = 0.05;
  FlagSet flags(kCommand);
  flags.AddString("kind", &f.kind, "drafter kind: specformer");
  flags.AddString("model", &t.target_dir, "the frozen target model directory");
  flags.AddString("data", &t.distill_path, "self-distillation dataset (specula distill)");
  flags.AddString("raw-tokens", &t.raw_tokens,
                  "ablation: train on raw corpus continuations from this token file instead "
                  "(e.g. data/corpus/train.tok)");
  flags.AddInt("raw-records", &t.raw_records, "ablation: records cut from --raw-tokens");
  flags.AddInt("raw-response-tokens", &t.raw_response_tokens,
               "ablation: continuation tokens per record");
  flags.AddString("out", &t.out_dir, "output drafter directory (checkpoints in OUT/checkpoint)");
  flags.AddInt("draft-len", &t.draft_len, "l_d: draft slots");
  flags.AddInt("intermediate", &t.intermediate_size,
               "draft block SwiGLU size (0 = the target's intermediate_size)");
  flags.AddIntList("hidden-layers", &f.hidden_layers, "hooked target layers (default 0,L/2,L-1,L)");
  flags.AddBool("causal-draft", &t.causal_draft,
                "causal slot attention (reference code) instead of bidirectional (paper)");
  flags.AddInt("batch-size", &t.batch_size, "records per optimizer step");
  flags.AddInt("max-seq-len", &t.max_seq_len, "cut records to this many tokens (0 = context)");
  flags.AddDouble("position-fraction", &t.position_fraction,
                  "share of response positions whose slots are trained each step (cheaper "
                  "steps; the context attention still sees every position)");
  flags.AddInt("val-records", &t.val_records, "records held out for validation (the last ones)");
  flags.AddInt("steps", &t.lr.total_steps, "optimizer steps");
  flags.AddDouble("warmup-fraction", &warmup_fraction, "linear warmup share of the steps");
  flags.AddDouble("lr", &t.lr.peak_lr, "peak learning rate");
  flags.AddDouble("min-lr", &t.lr.min_lr, "final learning rate of the cosine decay");
  flags.AddDouble("weight-decay", &t.weight_decay, "AdamW weight decay");
  flags.AddDouble("adam-eps", &t.adam_eps, "AdamW epsilon");
  flags.AddDouble("grad-clip", &t.grad_clip, "max global gradient norm (0 = off)");
  flags.AddInt("eval-every", &t.eval_every, "validation every N steps");
  flags.AddInt("checkpoint-every", &t.checkpoint_every, "checkpoint every N steps");
  flags.AddInt("log-every", &t.log_every, "progress line every N steps");
  flags.AddInt("max-steps-this-run", &t.max_steps_this_run, "stop after N steps (resume later)");
  flags.AddBool("resume", &t.resume, "continue from OUT/checkpoint when present");
  flags.AddInt("seed", &f.seed, "seed for init and data order");
  flags.AddInt("threads", &f.threads, "intra-op CPU threads (0 = LibTorch default)");
  return RunCommand(flags, args, [&] {
    t.lr.warmup_steps = static_cast<int64_t>(std::lround(warmup_fraction * t.lr.total_steps));
    return Run(f, args);
  });
}

}  // namespace specula::cli
