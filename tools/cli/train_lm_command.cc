// specula train-lm: train a Llama-style causal LM on a prepared corpus (the bundled target and the
// standalone draft LM), then write an HF-layout model directory with the corpus tokenizer; or
// fine-tune one (--init-from) on the self-distillation set (--distill-data): what the target says.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/train/distill_dataset.h"
#include "common/train/lm_trainer.h"
#include "common/util/mapped_file.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"

namespace specula::cli {
namespace {

constexpr char kCommand[] = "train-lm";

struct Flags {
  std::string data = "data/corpus";
  std::string distill_data;
  std::string init_from;
  int64_t val_records = 64;
  std::string out;
  std::string preset = "target";
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, intermediate = 0, max_position = 0;
  LmTrainOptions train;
  double peak_lr = 0, min_lr = 0;
  int64_t steps = 0, warmup = 0, threads = 0, seed = 0;
};

// Model shapes: "target" is the bundled model; "draft" is the several-times-smaller draft LM.
ModelConfig Preset(const std::string& name) {
  ModelConfig c;
  c.arch = Architecture::kLlama;
  c.model_type = "llama";
  c.tie_word_embeddings = true;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000;
  c.max_position_embeddings = 1024;
  if (name == "draft") {
    c.hidden_size = 128;
    c.intermediate_size = 384;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
  } else {
    c.hidden_size = 256;
    c.intermediate_size = 768;
    c.num_hidden_layers = 6;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  return c;
}

// Writes the distill set as OUT/data/{train,val}.tok (the last `val_records` records held out, as
// the drafter recipe holds them out) and points the options at them.
Status UseDistillData(Flags& f, const ModelConfig& c) {
  namespace fs = std::filesystem;
  ASSIGN_OR_RETURN(DistillDataset d, DistillDataset::Open(f.distill_data));
  if (d.vocab_size() != c.vocab_size) {
    return InvalidArgumentError(StrCat("--distill-data ", f.distill_data,
                                       " was made for a vocabulary of ", d.vocab_size(),
                                       " tokens, the model has ", c.vocab_size));
  }
  if (f.val_records < 0 || static_cast<size_t>(f.val_records) >= d.size()) {
    return InvalidArgumentError(
        StrCat("--val-records must be in [0, ", d.size(), "), got ", f.val_records));
  }
  if (c.eos_token_ids.empty()) {
    return InvalidArgumentError(
        StrCat("--init-from ", f.init_from, ": config.json has no eos_token_id"));
  }
  const int32_t eot = c.eos_token_ids.front();
  const size_t split = d.size() - static_cast<size_t>(f.val_records);
  const fs::path dir = fs::path(f.out) / "data";
  fs::create_directories(dir);
  f.train.train_tokens = (dir / "train.tok").string();
  f.train.val_tokens = f.val_records > 0 ? (dir / "val.tok").string() : "";
  RETURN_IF_ERROR(WriteTokenFile(f.train.train_tokens, DistillTokenStream(d, 0, split, eot)));
  if (f.val_records > 0) {
    RETURN_IF_ERROR(
        WriteTokenFile(f.train.val_tokens, DistillTokenStream(d, split, d.size(), eot)));
  }
  return OkStatus();
}

// The shape to train: a preset with the flags' overrides and the corpus's vocabulary, or the
// --init-from model's own config.json (overrides refused: the weights fix the shape).
StatusOr<ModelConfig> Shape(const Flags& f) {
  namespace fs = std::filesystem;
  if (!f.init_from.empty()) {
    if (f.layers || f.hidden || f.heads || f.kv_heads || f.intermediate || f.max_position) {
      return InvalidArgumentError("--init-from fixes the model's shape: drop the shape flags");
    }
    return ModelConfig::FromFile((fs::path(f.init_from) / "config.json").string());
  }
  if (f.preset != "target" && f.preset != "draft") {
    return InvalidArgumentError(StrCat("--preset must be target or draft, got '", f.preset, "'"));
  }
  ASSIGN_OR_RETURN(std::string manifest_text,
                   ReadFileToString((fs::path(f.data) / "manifest.json").string()));
  auto manifest = nlohmann::json::parse(manifest_text, nullptr, false);
  if (manifest.is_discarded() || !manifest.contains("vocab_size")) {
    return InvalidArgumentError(
        StrCat(f.data, "/manifest.json: malformed (run specula prepare-corpus)"));
  }
  ModelConfig c = Preset(f.preset);
  c.vocab_size = manifest["vocab_size"].get<int64_t>();
  c.eos_token_ids = {manifest["end_of_text_id"].get<int32_t>()};
  if (f.layers) c.num_hidden_layers = f.layers;
  if (f.hidden) c.hidden_size = f.hidden;
  if (f.heads) c.num_attention_heads = f.heads;
  if (f.kv_heads) c.num_key_value_heads = f.kv_heads;
  if (f.intermediate) c.intermediate_size = f.intermediate;
  if (f.max_position) c.max_position_embeddings = f.max_position;
  c.head_dim = c.hidden_size / c.num_attention_heads;
  return c;
}

Status Run(Flags f) {
  namespace fs = std::filesystem;
  if (f.out.empty()) return InvalidArgumentError("--out is required");
  if (!f.distill_data.empty() && f.init_from.empty()) {
    return InvalidArgumentError(
        "--distill-data fine-tunes a trained LM: give it one with --init-from DIR");
  }
  ASSIGN_OR_RETURN(ModelConfig c, Shape(f));
  RETURN_IF_ERROR(c.Validate("model shape"));

  if (f.threads > 0) SetThreads(f.threads);
  if (!f.distill_data.empty()) {
    RETURN_IF_ERROR(UseDistillData(f, c));
  } else {
    f.train.train_tokens = (fs::path(f.data) / "train.tok").string();
    f.train.val_tokens = (fs::path(f.data) / "val.tok").string();
  }
  f.train.init_from = f.init_from;
  f.train.out_dir = f.out;
  f.train.seed = static_cast<uint64_t>(f.seed);
  std::fprintf(stderr, "training %s: %ld layers, hidden %ld, %ld params, %ld steps of %ld tokens\n",
               (f.init_from.empty() ? f.preset : f.init_from).c_str(), c.num_hidden_layers,
               c.hidden_size, c.num_parameters(), f.train.lr.total_steps,
               f.train.batch_size * f.train.seq_len * f.train.grad_accum);
  const auto started = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(LmTrainResult result, TrainLanguageModel(c, f.train));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (!result.finished) {
    std::fprintf(stderr, "stopped at step %ld of %ld; run the same command again to resume\n",
                 result.steps_done, f.train.lr.total_steps);
    return OkStatus();
  }
  // The model directory is self-contained: tokenizer and training facts next to the weights.
  const fs::path tokenizer_dir = f.init_from.empty() ? fs::path(f.data) : fs::path(f.init_from);
  ASSIGN_OR_RETURN(std::string tok, ReadFileToString((tokenizer_dir / "tokenizer.json").string()));
  RETURN_IF_ERROR(WriteStringToFile((fs::path(f.out) / "tokenizer.json").string(), tok));
  nlohmann::json info = {{"preset", f.init_from.empty() ? f.preset : "init-from"},
                         {"init_from", f.init_from},
                         {"data", f.distill_data.empty() ? f.data : f.distill_data},
                         {"num_parameters", c.num_parameters()},
                         {"steps", result.steps_done},
                         {"seconds_this_run", seconds},
                         {"tokens_seen", result.tokens_seen},
                         {"final_train_loss", result.last_train_loss},
                         {"final_val_loss", result.last_val_loss},
                         {"final_val_perplexity", std::exp(result.last_val_loss)},
                         {"seed", f.seed},
                         {"depth_scaled_init", f.train.depth_scaled_init},
                         {"warmup_steps", f.train.lr.warmup_steps},
                         {"peak_lr", f.train.lr.peak_lr}};
  if (!f.init_from.empty()) {
    // A fine-tune's cost includes the base's training: keep its facts beside this run's.
    info.erase("depth_scaled_init");
    auto base = ReadFileToString((fs::path(f.init_from) / "training.json").string());
    if (base.ok()) {
      auto base_info = nlohmann::json::parse(*base, nullptr, false);
      if (!base_info.is_discarded()) info["base_training"] = base_info;
    }
  }
  RETURN_IF_ERROR(
      WriteStringToFile((fs::path(f.out) / "training.json").string(), info.dump(2) + "\n"));
  std::fprintf(stderr, "done: %s (val ppl %.2f)\n", f.out.c_str(), std::exp(result.last_val_loss));
  return OkStatus();
}

}  // namespace

int RunTrainLm(const std::vector<std::string>& args) {
  Flags f;
  f.train.lr = {.peak_lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 100, .total_steps = 2000};
  FlagSet flags(kCommand);
  flags.AddString("data", &f.data, "prepared corpus directory (specula prepare-corpus)");
  flags.AddString("out", &f.out, "output model directory (checkpoints in OUT/checkpoint)");
  flags.AddString("distill-data", &f.distill_data,
                  "self-distillation set (specula distill) to fine-tune on instead of --data: "
                  "records as prompt + response + end-of-text; needs --init-from");
  flags.AddInt("val-records", &f.val_records,
               "with --distill-data: the last N records are the validation set");
  flags.AddString("init-from", &f.init_from,
                  "model directory whose weights start the run (its config.json is the shape)");
  flags.AddString("preset", &f.preset, "model shape: target or draft");
  flags.AddInt("layers", &f.layers, "override the preset's num_hidden_layers");
  flags.AddInt("hidden", &f.hidden, "override hidden_size");
  flags.AddInt("heads", &f.heads, "override num_attention_heads");
  flags.AddInt("kv-heads", &f.kv_heads, "override num_key_value_heads");
  flags.AddInt("intermediate", &f.intermediate, "override intermediate_size");
  flags.AddInt("max-position", &f.max_position, "override max_position_embeddings");
  flags.AddInt("batch-size", &f.train.batch_size, "sequences per micro-batch");
  flags.AddInt("seq-len", &f.train.seq_len, "tokens per training window");
  flags.AddInt("grad-accum", &f.train.grad_accum, "micro-batches per optimizer step");
  flags.AddInt("steps", &f.train.lr.total_steps, "optimizer steps");
  flags.AddInt("warmup", &f.train.lr.warmup_steps, "linear warmup steps");
  flags.AddDouble("lr", &f.train.lr.peak_lr, "peak learning rate");
  flags.AddDouble("min-lr", &f.train.lr.min_lr, "final learning rate of the cosine decay");
  flags.AddDouble("weight-decay", &f.train.weight_decay, "AdamW weight decay");
  flags.AddDouble("grad-clip", &f.train.grad_clip, "max global gradient norm (0 = off)");
  flags.AddInt("eval-every", &f.train.eval_every, "validation every N steps");
  flags.AddInt("checkpoint-every", &f.train.checkpoint_every, "checkpoint every N steps");
  flags.AddInt("log-every", &f.train.log_every, "progress line every N steps");
  flags.AddInt("max-steps-this-run", &f.train.max_steps_this_run,
               "stop after N steps (resume later)");
  flags.AddInt("seed", &f.seed, "seed for init and data order");
  flags.AddBool("depth-scaled-init", &f.train.depth_scaled_init,
                "scale the residual projections' init by 1/sqrt(2 * layers) (GPT-2)");
  flags.AddInt("threads", &f.threads, "intra-op CPU threads (0 = LibTorch default)");
  return RunCommand(flags, args, [&] { return Run(f); });
}

}  // namespace specula::cli
