// specula train-drafter: train a drafter for a frozen target by self-distillation (the target's
// own responses from `specula distill`), or on raw corpus continuations with --raw-tokens (the
// SpecFormer paper's ablation), and write a drafter checkpoint (config.json naming kind and
// target, model.safetensors, training.json).
//   --kind specformer: SpecFormer (common/train/specformer_trainer.h).
//   --kind beagle: Beagle's two-stage block-attention training (common/train/beagle_trainer.h).
//   --kind parallelspec: ParallelSpec's group-wise training (common/train/parallelspec_trainer.h).
//   --kind specdec: SpecDec's Spec-Drafter with glancing training (common/train/specdec_trainer.h);
//     its optimiser defaults are the paper's (Adam 0.9/0.999, eps 1e-6, inverse-sqrt decay).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/drafters/beagle/beagle_config.h"
#include "common/drafters/parallelspec/parallelspec_config.h"
#include "common/drafters/specdec/specdec_config.h"
#include "common/drafters/specformer/specformer_config.h"
#include "common/model/model_config.h"
#include "common/train/beagle_trainer.h"
#include "common/train/parallelspec_trainer.h"
#include "common/train/specdec_trainer.h"
#include "common/train/specformer_trainer.h"
#include "common/util/mapped_file.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"

namespace specula::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kCommand[] = "train-drafter";

struct Flags {
  std::string kind = "specformer";
  DrafterTrainOptions common;  // the flags every kind has
  SpecFormerTrainOptions specformer;
  BeagleTrainOptions beagle;
  ParallelSpecTrainOptions parallelspec;
  SpecDecTrainOptions specdec;
  int64_t intermediate = 0;
  int64_t threads = 0, seed = 0;
};

// The kind's options with the common flags (grad_clip, adam_eps, adam_beta2 < 0: the kind's
// default).
template <typename Options>
Options WithCommon(const Flags& f, Options kind) {
  const double grad_clip = kind.grad_clip, adam_eps = kind.adam_eps, beta2 = kind.beta2;
  static_cast<DrafterTrainOptions&>(kind) = f.common;
  if (f.common.grad_clip < 0) kind.grad_clip = grad_clip;
  if (f.common.adam_eps < 0) kind.adam_eps = adam_eps;
  if (f.common.beta2 < 0) kind.beta2 = beta2;
  kind.seed = static_cast<uint64_t>(f.seed);
  kind.intermediate_size = f.intermediate;
  return kind;
}

// training.json: what every kind records, plus `extra`.
Status WriteTrainingJson(const Flags& f, const DrafterTrainOptions& o,
                         const std::vector<std::string>& args, int64_t steps, int64_t tokens_seen,
                         double seconds, const nlohmann::json& extra) {
  std::string command = "specula train-drafter";
  for (const auto& a : args) command += " " + a;
  nlohmann::json info = {{"kind", f.kind},
                         {"command", command},
                         {"target", o.target_dir},
                         {"data", o.raw_tokens.empty() ? o.distill_path : o.raw_tokens},
                         {"self_distilled", o.raw_tokens.empty()},
                         {"steps", steps},
                         {"tokens_seen", tokens_seen},
                         {"seconds_this_run", seconds},
                         {"seed", f.seed}};
  info.update(extra);
  return WriteStringToFile((fs::path(o.out_dir) / "training.json").string(), info.dump(2) + "\n");
}

// JSON has no NaN: a value that was not measured (a stage that did not run) is null.
nlohmann::json FiniteOrNull(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
}
nlohmann::json FiniteOrNull(const std::vector<double>& values) {
  nlohmann::json out = nlohmann::json::array();
  for (double v : values) out.push_back(FiniteOrNull(v));
  return out;
}

// The losses the slot drafters' trainers report alike (SpecFormer, SpecDec), added to `json`.
template <typename SlotTrainResult>
nlohmann::json WithSlotLosses(nlohmann::json json, const SlotTrainResult& r) {
  json["first_train_loss"] = FiniteOrNull(r.first_loss);
  json["final_train_loss"] = FiniteOrNull(r.last_loss);
  json["final_val_loss"] = FiniteOrNull(r.val_loss);
  json["val_slot_loss"] = FiniteOrNull(r.val_slot_loss);
  json["val_slot_top1"] = FiniteOrNull(r.val_slot_accuracy);
  return json;
}

Status ReportStopped(int64_t steps_done, int64_t total) {
  std::fprintf(stderr, "stopped at step %ld of %ld; run the same command again to resume\n",
               steps_done, total);
  return OkStatus();
}

Status RunSpecFormer(const Flags& f, const ModelConfig& target,
                     const std::vector<std::string>& args) {
  const SpecFormerTrainOptions o = WithCommon(f, f.specformer);
  SpecFormerConfig shape = SpecFormerConfig::ForTarget(target, o.draft_len);
  if (o.intermediate_size > 0) shape.intermediate_size = o.intermediate_size;
  if (!o.hidden_layers.empty()) shape.hidden_layers = o.hidden_layers;
  shape.pending_token = o.pending_token;
  const int64_t shared = shape.shared_parameters(), per_slot = shape.per_slot_parameters();
  const int64_t M = target.num_parameters();
  const double p = 1.0 + static_cast<double>(shared + shape.draft_len * per_slot) / M;
  std::fprintf(stderr,
               "training specformer for %s on %s: l_d %ld, %ld params (m_s %ld + l_d x m_p %ld), "
               "target %ld params, p = %.3f, %ld steps of %ld records\n",
               o.target_dir.c_str(),
               o.raw_tokens.empty() ? o.distill_path.c_str() : o.raw_tokens.c_str(),
               shape.draft_len, shared + shape.draft_len * per_slot, shared, per_slot, M, p,
               o.lr.total_steps, o.batch_size);
  ASSIGN_OR_RETURN(SpecFormerTrainResult result, TrainSpecFormer(o));
  if (!result.finished) return ReportStopped(result.steps_done, o.lr.total_steps);
  RETURN_IF_ERROR(WriteTrainingJson(
      f, o, args, result.steps_done, result.tokens_seen, result.seconds,
      WithSlotLosses(
          {{"parameters", {{"shared", shared}, {"per_slot", per_slot}, {"target", M}}}, {"p", p}},
          result)));
  std::fprintf(stderr, "done: %s (val loss %.4f)\n", o.out_dir.c_str(), result.val_loss);
  return OkStatus();
}

Status RunBeagle(const Flags& f, const ModelConfig& target, const std::vector<std::string>& args) {
  const BeagleTrainOptions o = WithCommon(f, f.beagle);
  BeagleConfig shape = BeagleConfig::ForTarget(target);
  if (o.intermediate_size > 0) shape.intermediate_size = o.intermediate_size;
  const int64_t params = shape.parameters(), M = target.num_parameters();
  std::fprintf(stderr,
               "training beagle for %s on %s: %ld params (target %ld), window %ld, %ld simulation "
               "steps, early stage %.0f%% of %ld steps of %ld records\n",
               o.target_dir.c_str(),
               o.raw_tokens.empty() ? o.distill_path.c_str() : o.raw_tokens.c_str(), params, M,
               o.window, o.sim_steps, 100 * o.early_fraction, o.lr.total_steps, o.batch_size);
  ASSIGN_OR_RETURN(BeagleTrainResult result, TrainBeagle(o));
  if (!result.finished) return ReportStopped(result.steps_done, o.lr.total_steps);
  RETURN_IF_ERROR(WriteTrainingJson(
      f, o, args, result.steps_done, result.tokens_seen, result.seconds,
      {{"parameters", {{"drafter", params}, {"target", M}}},
       {"window", o.window},
       {"sim_steps", o.sim_steps},
       {"early_steps", result.early_steps},
       {"noise_std", o.noise_std},
       {"vloss_weight", o.vloss_weight},
       {"lr", {{"peak", o.lr.peak_lr}, {"min", o.lr.min_lr}, {"warmup_steps", o.lr.warmup_steps}}},
       {"batch_size", o.batch_size},
       {"early_first_loss", FiniteOrNull(result.early_first_loss)},
       {"early_last_loss", FiniteOrNull(result.early_last_loss)},
       {"late_first_loss", FiniteOrNull(result.late_first_loss)},
       {"late_last_loss", FiniteOrNull(result.late_last_loss)},
       {"val_early_loss", FiniteOrNull(result.val_early_loss)},
       {"val_late_loss", FiniteOrNull(result.val_late_loss)},
       {"val_top1_by_depth", FiniteOrNull(result.val_top1)}}));
  std::fprintf(stderr, "done: %s (val late loss %.4f)\n", o.out_dir.c_str(), result.val_late_loss);
  return OkStatus();
}

Status RunParallelSpec(const Flags& f, const ModelConfig& target,
                       const std::vector<std::string>& args) {
  ParallelSpecTrainOptions o = WithCommon(f, f.parallelspec);
  o.noise_std = f.beagle.noise_std;  // --noise-std is shared with beagle
  ParallelSpecConfig shape = ParallelSpecConfig::ForTarget(target, o.num_mask_tokens);
  shape.use_target_features = o.use_target_features;
  if (o.intermediate_size > 0) shape.intermediate_size = o.intermediate_size;
  const int64_t params = shape.parameters(), M = target.num_parameters();
  std::fprintf(stderr,
               "training parallelspec for %s on %s: %ld params (target %ld), k %ld masks, %s, "
               "%ld steps of %ld records\n",
               o.target_dir.c_str(),
               o.raw_tokens.empty() ? o.distill_path.c_str() : o.raw_tokens.c_str(), params, M,
               o.num_mask_tokens,
               o.use_target_features ? "target features (EAGLE integration)"
                                     : "token embeddings only (Medusa integration)",
               o.lr.total_steps, o.batch_size);
  ASSIGN_OR_RETURN(ParallelSpecTrainResult result, TrainParallelSpec(o));
  if (!result.finished) return ReportStopped(result.steps_done, o.lr.total_steps);
  RETURN_IF_ERROR(WriteTrainingJson(
      f, o, args, result.steps_done, result.tokens_seen, result.seconds,
      {{"parameters", {{"drafter", params}, {"target", M}}},
       {"num_mask_tokens", o.num_mask_tokens},
       {"use_target_features", o.use_target_features},
       {"noise_std", o.noise_std},
       {"ce_weight", o.ce_weight},
       {"group_fraction", o.group_fraction},
       {"lr", {{"peak", o.lr.peak_lr}, {"min", o.lr.min_lr}, {"warmup_steps", o.lr.warmup_steps}}},
       {"adamw", {{"beta1", o.beta1}, {"beta2", o.beta2}, {"weight_decay", o.weight_decay}}},
       {"batch_size", o.batch_size},
       {"first_train_loss", FiniteOrNull(result.first_loss)},
       {"final_train_loss", FiniteOrNull(result.last_loss)},
       {"final_val_loss", FiniteOrNull(result.val_loss)},
       {"val_top1_by_depth", FiniteOrNull(result.val_top1)}}));
  return OkStatus();
}

// SpecDec: the paper's optimiser (Adam 0.9/0.999, eps 1e-6, wd 0.01, inverse-sqrt after warmup)
// unless the flags say otherwise.
Status RunSpecDec(const Flags& f, const std::vector<std::string>& args) {
  SpecDecTrainOptions defaults = f.specdec;
  defaults.beta2 = 0.999;
  defaults.adam_eps = 1e-6;
  SpecDecTrainOptions o = WithCommon(f, defaults);
  o.intermediate_size = f.intermediate > 0 ? f.intermediate : f.specdec.intermediate_size;
  o.lr.inverse_sqrt = true;
  std::fprintf(stderr,
               "training specdec for %s on %s: d %ld, %ld encoder + %ld decoder layers, k %ld, "
               "%ld drafts per record, glancing %.2f (annealed to 0), %ld steps of %ld records\n",
               o.target_dir.c_str(),
               o.raw_tokens.empty() ? o.distill_path.c_str() : o.raw_tokens.c_str(), o.hidden_size,
               o.encoder_layers, o.decoder_layers, o.num_slots, o.splits_per_record,
               o.glancing_ratio, o.lr.total_steps, o.batch_size);
  ASSIGN_OR_RETURN(SpecDecTrainResult result, TrainSpecDec(o));
  if (!result.finished) return ReportStopped(result.steps_done, o.lr.total_steps);
  RETURN_IF_ERROR(WriteTrainingJson(
      f, o, args, result.steps_done, result.tokens_seen, result.seconds,
      WithSlotLosses({{"parameters", result.parameters},
                      {"optimizer",
                       {{"beta1", o.beta1},
                        {"beta2", o.beta2},
                        {"eps", o.adam_eps},
                        {"weight_decay", o.weight_decay},
                        {"schedule", "linear warmup, inverse sqrt"},
                        {"peak_lr", o.lr.peak_lr},
                        {"warmup_steps", o.lr.warmup_steps}}},
                      {"glancing_ratio", o.glancing_ratio},
                      {"label_smoothing", o.label_smoothing},
                      {"splits_per_record", o.splits_per_record},
                      {"init_encoder_from", o.init_encoder_from},
                      {"encoder_layers_initialised", result.encoder_layers_initialised}},
                     result)));
  std::fprintf(stderr, "done: %s (val loss %.4f)\n", o.out_dir.c_str(), result.val_loss);
  return OkStatus();
}

Status Run(const Flags& f, const std::vector<std::string>& args) {
  if (f.kind != kSpecFormerKind && f.kind != kBeagleKind && f.kind != kParallelSpecKind &&
      f.kind != kSpecDecKind) {
    return InvalidArgumentError(StrCat("--kind: unknown drafter kind '", f.kind,
                                       "' (trainable: specformer, beagle, parallelspec, specdec)"));
  }
  if (f.common.target_dir.empty()) return InvalidArgumentError("--model (the target) is required");
  if (f.common.out_dir.empty()) return InvalidArgumentError("--out is required");
  if (f.threads > 0) SetThreads(f.threads);
  ASSIGN_OR_RETURN(ModelConfig target,
                   ModelConfig::FromFile((fs::path(f.common.target_dir) / "config.json").string()));
  if (f.kind == kParallelSpecKind) return RunParallelSpec(f, target, args);
  if (f.kind == kSpecDecKind) return RunSpecDec(f, args);
  return f.kind == kBeagleKind ? RunBeagle(f, target, args) : RunSpecFormer(f, target, args);
}

}  // namespace

int RunTrainDrafter(const std::vector<std::string>& args) {
  Flags f;
  DrafterTrainOptions& t = f.common;
  t.lr = {.peak_lr = 5e-4, .min_lr = 1e-5, .warmup_steps = 0, .total_steps = 1000};
  t.grad_clip = -1;
  t.adam_eps = -1;
  t.beta2 = -1;
  double warmup_fraction = 0.05;
  FlagSet flags(kCommand);
  flags.AddString("kind", &f.kind, "drafter kind: specformer, beagle, parallelspec or specdec");
  flags.AddString("model", &t.target_dir, "the frozen target model directory");
  flags.AddString("data", &t.distill_path, "self-distillation dataset (specula distill)");
  flags.AddString("raw-tokens", &t.raw_tokens,
                  "ablation: train on raw corpus continuations from this token file instead "
                  "(e.g. data/corpus/train.tok)");
  flags.AddInt("raw-records", &t.raw_records, "ablation: records cut from --raw-tokens");
  flags.AddInt("raw-response-tokens", &t.raw_response_tokens,
               "ablation: continuation tokens per record");
  flags.AddString("out", &t.out_dir, "output drafter directory (checkpoints in OUT/checkpoint)");
  flags.AddInt("intermediate", &f.intermediate,
               "draft block SwiGLU size (0 = the target's intermediate_size; specdec: 384)");
  SpecFormerTrainOptions& sf = f.specformer;
  flags.AddInt("draft-len", &sf.draft_len, "specformer: l_d, draft slots");
  flags.AddIntList("hidden-layers", &sf.hidden_layers,
                   "specformer: hooked target layers (default 0,L/2,L-1,L)");
  flags.AddBool("causal-draft", &sf.causal_draft,
                "specformer: causal slot attention (reference code) instead of bidirectional "
                "(paper)");
  flags.AddBool("pending-token", &sf.pending_token,
                "specformer: each row also reads the next token's embedding (the pending token "
                "at drafting time; an extension the paper does not have)");
  flags.AddDouble("position-fraction", &sf.position_fraction,
                  "specformer: share of response positions whose slots are trained each step "
                  "(cheaper steps; the context attention still sees every position)");
  BeagleTrainOptions& b = f.beagle;
  flags.AddInt("window", &b.window, "beagle: k, the block-attention window");
  flags.AddInt("sim-steps", &b.sim_steps, "beagle: s <= k, late-stage simulation steps");
  flags.AddDouble("early-fraction", &b.early_fraction,
                  "beagle: share of the steps in the early (inverse block attention) stage");
  flags.AddDouble("noise-std", &b.noise_std,
                  "beagle, parallelspec: Gaussian noise on the target's states");
  ParallelSpecTrainOptions& ps = f.parallelspec;
  flags.AddInt("num-masks", &ps.num_mask_tokens, "parallelspec: k, [MASK] tokens (depths 2..k+1)");
  flags.AddBool("use-target-features", &ps.use_target_features,
                "parallelspec: fuse the target's top states (EAGLE integration); false = token "
                "embeddings only (Medusa integration)");
  flags.AddDouble("ce-weight", &ps.ce_weight,
                  "parallelspec: CE weight next to the feature regression (EAGLE: 0.1)");
  flags.AddDouble("group-fraction", &ps.group_fraction,
                  "parallelspec: share of the eligible groups whose masks are trained each step");
  flags.AddDouble("vloss-weight", &b.vloss_weight,
                  "beagle: weight of the hidden-state regression (CE weight 1)");
  SpecDecTrainOptions& sd = f.specdec;
  flags.AddInt("hidden-size", &sd.hidden_size, "specdec: the drafter's width");
  flags.AddInt("encoder-layers", &sd.encoder_layers, "specdec: L_e, context encoder layers");
  flags.AddInt("decoder-layers", &sd.decoder_layers, "specdec: L_d, mask decoder layers");
  flags.AddInt("num-slots", &sd.num_slots, "specdec: k, slots drafted per pass");
  flags.AddInt("heads", &sd.num_attention_heads, "specdec: attention heads");
  flags.AddInt("kv-heads", &sd.num_key_value_heads, "specdec: key/value heads");
  flags.AddInt("head-dim", &sd.head_dim, "specdec: head dimension");
  flags.AddInt("splits-per-record", &sd.splits_per_record,
               "specdec: random split points (drafts) trained per record and step");
  flags.AddDouble("glancing-ratio", &sd.glancing_ratio,
                  "specdec: share of wrong slots revealed, annealed linearly to 0 (0 = off)");
  flags.AddDouble("label-smoothing", &sd.label_smoothing, "specdec: CE label smoothing");
  flags.AddString("init-encoder-from", &sd.init_encoder_from,
                  "specdec: a token-only Llama LM of the encoder's geometry (e.g. "
                  "models/pyllama-draft-1m) whose embedding, final norm and first layers "
                  "initialise the context encoder");
  flags.AddInt("batch-size", &t.batch_size, "records per optimizer step");
  flags.AddInt("max-seq-len", &t.max_seq_len, "cut records to this many tokens (0 = context)");
  flags.AddInt("val-records", &t.val_records, "records held out for validation (the last ones)");
  flags.AddInt("steps", &t.lr.total_steps, "optimizer steps");
  flags.AddDouble("warmup-fraction", &warmup_fraction, "linear warmup share of the steps");
  flags.AddDouble("lr", &t.lr.peak_lr, "peak learning rate");
  flags.AddDouble("min-lr", &t.lr.min_lr,
                  "final learning rate of the cosine decay (= --lr: constant after warmup)");
  flags.AddDouble("weight-decay", &t.weight_decay, "AdamW weight decay");
  flags.AddDouble("adam-eps", &t.adam_eps, "AdamW epsilon (< 0 = the kind's: 1e-8, specdec 1e-6)");
  flags.AddDouble("adam-beta2", &t.beta2,
                  "AdamW beta2 (< 0 = the kind's: specformer/beagle/parallelspec 0.95, specdec "
                  "0.999)");
  flags.AddDouble(
      "grad-clip", &t.grad_clip,
      "max global gradient norm (0 = off; < 0 = the kind's: specformer, parallelspec 1, "
      "beagle 0.5)");
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
