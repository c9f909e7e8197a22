#include "common/drafters/drafter_registry.h"

#include <utility>

#include "common/drafters/drafter_warm_up.h"

namespace specula {

DrafterLoadContext::DrafterLoadContext(const ModelRunner& target, ModelRunnerOptions model_options)
    : target_(&target), target_config_(target.config()), model_options_(std::move(model_options)) {}

DrafterLoadContext::DrafterLoadContext(const ModelConfig& target_config, std::string target_dir,
                                       ModelRunnerOptions model_options)
    : target_config_(target_config),
      target_dir_(std::move(target_dir)),
      model_options_(std::move(model_options)) {}

DrafterLoadContext::~DrafterLoadContext() = default;

StatusOr<const ModelRunner*> DrafterLoadContext::target(const std::string& drafter) {
  if (target_) return target_;
  const std::string context = StrCat("--model (", drafter, "'s target)");
  if (target_dir_.empty()) {
    return InvalidArgumentError(StrCat(context, ": no target model to load the drafter for"));
  }
  auto loaded = ModelRunner::Load(target_dir_, model_options_);
  if (!loaded.ok()) return loaded.status().WithContext(context);
  own_target_ = std::move(*loaded);
  target_ = own_target_.get();
  return target_;
}

void DrafterRegistry::Add(std::unique_ptr<DrafterFamily> family) {
  families_.push_back(std::move(family));
}

void DrafterRegistry::RegisterFlags(FlagSet& flags) {
  for (auto& family : families_) family->RegisterFlags(flags);
  flags.AddString(
      "draft-vocab", &draft_vocab_path_,
      "draft_vocab.json (specula draft-vocab): specformer, beagle, parallelspec and draft-model "
      "rank only these tokens (a cheaper head; lossless); empty = the whole vocabulary");
  flags.AddString(
      "drafter-matmul", &matmul_,
      "int8, bfloat16 or float32: the float32 CPU forwards of draft-model, specformer, "
      "parallelspec and beagle multiply int8 copies of their weights scaled per output where the "
      "CPU has "
      "AVX-512, or bfloat16 copies where it has AVX512-BF16, else the weights themselves "
      "(cheaper drafts, still lossless; the drafts, and so which random numbers a seeded "
      "sampled request consumes, depend on the CPU; float32: the drafters' own results)");
}

std::vector<std::string> DrafterRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& family : families_) {
    for (const DrafterVariant& v : family->Variants()) names.push_back(v.name);
  }
  return names;
}

std::string DrafterRegistry::Describe() const {
  std::string out;
  for (const auto& family : families_) {
    for (const DrafterVariant& v : family->Variants()) {
      if (!out.empty()) out += ", ";
      out += v.name;
      if (!v.summary.empty()) out += StrCat(" (", v.summary, ")");
    }
  }
  return out;
}

const DrafterFamily* DrafterRegistry::Find(const std::string& name) const {
  for (const auto& family : families_) {
    for (const DrafterVariant& v : family->Variants()) {
      if (v.name == name) return family.get();
    }
  }
  return nullptr;
}

StatusOr<std::unique_ptr<Drafter>> DrafterRegistry::Load(const std::string& name,
                                                         DrafterLoadContext& context) const {
  const DrafterFamily* family = Find(name);
  if (!family) {
    std::string known;
    for (const std::string& n : Names()) known += (known.empty() ? "" : ", ") + n;
    return InvalidArgumentError(StrCat("unknown drafter '", name, "' (", known, ")"));
  }
  const std::optional<DraftMatmul> matmul = ParseDraftMatmul(matmul_);
  if (!matmul) {
    return InvalidArgumentError(
        StrCat("--drafter-matmul must be float32, bfloat16 or int8, got '", matmul_, "'"));
  }
  context.set_draft_matmul(*matmul);
  if (!draft_vocab_path_.empty() && !draft_vocab_) {
    auto vocab = DraftVocab::FromFile(draft_vocab_path_);
    if (!vocab.ok()) return vocab.status().WithContext("--draft-vocab");
    RETURN_IF_ERROR(vocab->CheckTarget(context.target_config().vocab_size,
                                       StrCat("--draft-vocab ", draft_vocab_path_)));
    draft_vocab_ = std::make_shared<const DraftVocab>(std::move(*vocab));
  }
  if (draft_vocab_) context.set_draft_vocab(draft_vocab_);
  ASSIGN_OR_RETURN(std::unique_ptr<Drafter> drafter, family->Load(name, context));
  // Its first calls' one-time costs paid here, not by the first request that drafts.
  RETURN_IF_ERROR(WarmUpDrafter(*drafter, context.target_config(), context.model_options()));
  return drafter;
}

nlohmann::json DrafterRegistry::Settings() const {
  nlohmann::json settings = nlohmann::json::object();
  for (const auto& family : families_) settings[family->family()] = family->Settings();
  settings["matmul"] = matmul_;
  if (!draft_vocab_path_.empty()) {
    settings["draft_vocab"] = {{"file", draft_vocab_path_}};
    if (draft_vocab_) {
      settings["draft_vocab"]["size"] = draft_vocab_->tokens.size();
      settings["draft_vocab"]["coverage"] = draft_vocab_->coverage;
    }
  }
  return settings;
}

DrafterRegistry BuiltinDrafterRegistry() {
  DrafterRegistry registry;
  registry.Add(MakeNgramFamily());
  registry.Add(MakeDraftModelFamily());
  registry.Add(MakeSpecFormerFamily());
  registry.Add(MakeBeagleFamily());
  registry.Add(MakeParallelSpecFamily());
  registry.Add(MakeSpecDecFamily());
  return registry;
}

}  // namespace specula
