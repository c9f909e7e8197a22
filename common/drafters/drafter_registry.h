// The drafter registry: every drafter kind the CLI and the services can load, by name.
//
// A DrafterFamily is one kind of drafter (n-gram, the draft LM, SpecFormer, Beagle, ParallelSpec,
// SpecDec) with its variants (the `--drafter` names it answers to, e.g. beagle and beagle-chain),
// its own flags (bound to the family's option fields) and its loader. Adding a drafter is one new
// family registered in BuiltinDrafterRegistry(); nothing in tools/ or services/ lists drafters.
//
//   DrafterRegistry registry = BuiltinDrafterRegistry();
//   registry.RegisterFlags(flags);                  // --beagle-model, --ngram-max, ...
//   flags.Parse(args);
//   DrafterLoadContext context(*target_runner, runner_options);
//   ASSIGN_OR_RETURN(auto drafter, registry.Load("beagle-chain", context));
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/drafters/draft_vocab.h"
#include "common/model/model_runner.h"
#include "common/spec/drafter.h"
#include "common/util/flags.h"
#include "common/util/status.h"

namespace specula {

// What a family needs to load a drafter for one target: the target's config, its weights for
// the families that share them (embedding, lm_head), and the device, dtype and KV settings for
// models a family loads on its own (the draft LM).
class DrafterLoadContext {
 public:
  // The target is served in this process.
  DrafterLoadContext(const ModelRunner& target, ModelRunnerOptions model_options);
  // No target in this process (the drafter role): `target_dir` is loaded on the first target()
  // call and kept until the context dies (the drafters keep only the modules they share).
  DrafterLoadContext(const ModelConfig& target_config, std::string target_dir,
                     ModelRunnerOptions model_options);
  ~DrafterLoadContext();
  DrafterLoadContext(const DrafterLoadContext&) = delete;
  DrafterLoadContext& operator=(const DrafterLoadContext&) = delete;

  const ModelConfig& target_config() const { return target_config_; }
  const ModelRunnerOptions& model_options() const { return model_options_; }
  // The target's runner, for the drafter `drafter` that shares its weights; loads it once where
  // the context has only its directory. The loader's error (NOT_FOUND, INVALID_ARGUMENT) with
  // "--model (<drafter>'s target)" as context otherwise.
  StatusOr<const ModelRunner*> target(const std::string& drafter);
  // The draft vocabulary the drafters that project onto the target's lm_head use (--draft-vocab);
  // nullptr = the whole vocabulary. Set by DrafterRegistry::Load.
  const std::shared_ptr<const DraftVocab>& draft_vocab() const { return draft_vocab_; }
  void set_draft_vocab(std::shared_ptr<const DraftVocab> v) { draft_vocab_ = std::move(v); }
  // How the drafters' float32 CPU forwards multiply (--drafter-matmul; CpuForward::
  // UseDraftMatmul). Set by DrafterRegistry::Load.
  DraftMatmul draft_matmul() const { return draft_matmul_; }
  void set_draft_matmul(DraftMatmul matmul) { draft_matmul_ = matmul; }

 private:
  std::shared_ptr<const DraftVocab> draft_vocab_;
  DraftMatmul draft_matmul_ = DraftMatmul::kFloat32;
  const ModelRunner* target_ = nullptr;
  std::unique_ptr<ModelRunner> own_target_;
  ModelConfig target_config_;
  std::string target_dir_;
  ModelRunnerOptions model_options_;
};

// One `--drafter` name and what it drafts, for --help.
struct DrafterVariant {
  std::string name;
  std::string summary;
};

class DrafterFamily {
 public:
  virtual ~DrafterFamily() = default;
  // The family's name ("beagle"): the key of its settings in Settings().
  virtual std::string family() const = 0;
  virtual std::vector<DrafterVariant> Variants() const = 0;
  // Adds the family's flags, bound to this object's option fields.
  virtual void RegisterFlags(FlagSet& flags) = 0;
  // Loads variant `name` (one of Variants()). INVALID_ARGUMENT naming the flag for a missing
  // checkpoint flag or a bad option; the loader's error, with the flag as context, otherwise.
  virtual StatusOr<std::unique_ptr<Drafter>> Load(const std::string& name,
                                                  DrafterLoadContext& context) const = 0;
  // The option values in force (bench records them with its results).
  virtual nlohmann::json Settings() const = 0;
};

class DrafterRegistry {
 public:
  DrafterRegistry() = default;
  DrafterRegistry(DrafterRegistry&&) = default;
  DrafterRegistry& operator=(DrafterRegistry&&) = default;

  // Adds a family; its variant names must be new (checked when loading: the first one wins).
  void Add(std::unique_ptr<DrafterFamily> family);
  // Every family's flags, --draft-vocab (shared by the families whose drafters project onto
  // the target's lm_head: specformer, beagle, parallelspec) and --drafter-matmul.
  void RegisterFlags(FlagSet& flags);

  // Every variant name, in registration order.
  std::vector<std::string> Names() const;
  // "ngram, draft-model, specformer (budgeted tree), ...": the names with their summaries.
  std::string Describe() const;
  // The family serving `name`; nullptr for an unknown name.
  const DrafterFamily* Find(const std::string& name) const;
  // INVALID_ARGUMENT listing the known names when `name` is unknown; the family's Load otherwise.
  // --draft-vocab's file is read on the first Load (INVALID_ARGUMENT / NOT_FOUND naming the flag)
  // and handed to the families through `context`, with --drafter-matmul (INVALID_ARGUMENT
  // naming it for a value other than float32, bfloat16 or int8). The drafter is warmed up
  // before it is returned (WarmUpDrafter: its error, with the drafter named, fails the load).
  StatusOr<std::unique_ptr<Drafter>> Load(const std::string& name,
                                          DrafterLoadContext& context) const;
  // {family: settings} for every family, "matmul", and "draft_vocab" when one is set.
  nlohmann::json Settings() const;

 private:
  std::vector<std::unique_ptr<DrafterFamily>> families_;
  std::string draft_vocab_path_;
  // int8 by default: the draft LM's steps at batch 1 1.07x faster than float32 here, SpecFormer's
  // 1.09x, acceptance unchanged (docs/BENCHMARKS.md); float32 on CPUs without AVX-512.
  std::string matmul_ = "int8";
  mutable std::shared_ptr<const DraftVocab> draft_vocab_;  // read once, on the first Load
};

// The families this build has: ngram, draft-model, specformer, beagle, parallelspec, specdec.
DrafterRegistry BuiltinDrafterRegistry();

// The built-in families, one per drafter kind (each defined beside its drafter).
std::unique_ptr<DrafterFamily> MakeNgramFamily();
std::unique_ptr<DrafterFamily> MakeDraftModelFamily();
std::unique_ptr<DrafterFamily> MakeSpecFormerFamily();
std::unique_ptr<DrafterFamily> MakeBeagleFamily();
std::unique_ptr<DrafterFamily> MakeParallelSpecFamily();
std::unique_ptr<DrafterFamily> MakeSpecDecFamily();

}  // namespace specula
