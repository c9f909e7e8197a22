#include "tools/cli/spec_flags.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/drafters/beagle/beagle_drafter.h"
#include "common/drafters/draft_model_drafter.h"
#include "common/drafters/ngram_drafter.h"
#include "common/drafters/parallelspec/parallelspec_drafter.h"
#include "common/drafters/specdec/specdec_drafter.h"
#include "common/drafters/specformer/specformer_drafter.h"

namespace specula::cli {

StatusOr<SpecEngineOptions> SpecFlags::EngineOptions(int64_t max_batch_size) const {
  if (max_step_tokens < 1) {
    return InvalidArgumentError(
        StrCat("--max-step-tokens must be at least 1, got ", max_step_tokens));
  }
  return SpecEngineOptions{.max_batch_size = static_cast<int32_t>(max_batch_size),
                           .max_step_tokens = max_step_tokens};
}

void SpecFlags::Register(FlagSet& flags, bool many_drafters) {
  flags.AddInt(
      "max-step-tokens", &max_step_tokens,
      "tokens per target forward: running sequences' tokens and drafts first, then "
      "prompts are prefilled in chunks with the rest (a long prompt never stalls decodes)");
  flags.AddString("drafter", &drafter,
                  many_drafters ? "comma-separated drafters to compare with no speculation: ngram, "
                                  "draft-model, specformer, beagle (dynamic tree), beagle-chain, "
                                  "parallelspec (budgeted tree), parallelspec-chain, "
                                  "parallelspec-static (Medusa tree), specdec"
                                : "none, ngram, draft-model, specformer, beagle (dynamic tree), "
                                  "beagle-chain, parallelspec (budgeted tree), parallelspec-chain, "
                                  "parallelspec-static (Medusa tree) or specdec");
  flags.AddString("drafter-model", &drafter_model, "draft LM directory for --drafter draft-model");
  flags.AddString("specformer-model", &specformer_model,
                  "SpecFormer checkpoint directory for --drafter specformer");
  flags.AddString("specdec-model", &specdec_model,
                  "SpecDec checkpoint directory for --drafter specdec (token-only)");
  flags.AddBool("specformer-tree", &specformer_tree,
                "specformer: budgeted tree of the k most probable paths (false: argmax chain)");
  flags.AddString("parallelspec-model", &parallelspec_model,
                  "ParallelSpec checkpoint directory for --drafter parallelspec / "
                  "parallelspec-chain / parallelspec-static");
  flags.AddString("parallelspec-static-tree", &parallelspec_static_tree,
                  "parallelspec-static: JSON array of rank paths, e.g. [[0], [1], [0, 0]]");
  flags.AddString("beagle-model", &beagle_model,
                  "Beagle checkpoint directory for --drafter beagle / beagle-chain");
  flags.AddInt("beagle-depth", &beagle_depth, "beagle: deepest drafted node");
  flags.AddInt("beagle-top-k", &beagle_top_k,
               "beagle: children per expanded node and frontier width (EAGLE-2 dynamic tree)");
  flags.AddInt("beagle-total-tokens", &beagle_total_tokens,
               "beagle: tree size cap (each step's draft budget caps it too)");
  flags.AddBool("beagle-concat", &beagle_concat,
                "beagle: drafted states as keys for deeper drafts (the paper's \"concate\")");
  flags.AddDouble("beagle-rank-temperature", &beagle_rank_temperature,
                  "beagle: divides the drafter's logits when ranking tree nodes (< 1 = deeper "
                  "trees at small budgets; 1 = EAGLE-2)");
  if (!many_drafters) {
    flags.AddInt("draft-len", &draft_len, "draft tokens per step (--draft-budget fixed)");
    flags.AddString("draft-budget", &draft_budget,
                    "fixed: --draft-len nodes every step | adaptive: each step's nodes chosen "
                    "from measured step costs and acceptance, up to --draft-cap");
  }
  flags.AddInt("draft-cap", &draft_cap, "adaptive: most draft nodes per step for one request");
  flags.AddString("cost-profile", &cost_profile,
                  "adaptive: warm-start the step cost model from `specula bench-forward --json`");
  flags.AddInt("tree-width", &tree_width, "draft-model: 1 = chain, w > 1 = tree of top-w children");
  flags.AddInt("ngram-min", &ngram_min, "ngram: shortest suffix to match");
  flags.AddInt("ngram-max", &ngram_max, "ngram: longest suffix to match");
  flags.AddString("verify", &verify,
                  "greedy | sample (lossless; default by --temperature) | specdec | typical "
                  "(both LOSSY)");
  flags.AddDouble("beta", &beta, "specdec: accept drafts within the target's top-beta");
  flags.AddDouble("tau", &tau, "specdec: largest log-probability gap to the top-1");
  flags.AddDouble("typical-epsilon", &typical_epsilon, "typical: probability threshold");
  flags.AddDouble("typical-delta", &typical_delta, "typical: entropy-scaled threshold");
}

StatusOr<std::vector<std::string>> SpecFlags::DrafterNames() const {
  std::vector<std::string> names;
  std::stringstream in(drafter);
  std::string name;
  while (std::getline(in, name, ',')) {
    if (name.empty()) continue;
    if (name != "none" && name != "ngram" && name != "draft-model" && name != "specformer" &&
        name != "beagle" && name != "beagle-chain" && name != "parallelspec" &&
        name != "parallelspec-chain" && name != "parallelspec-static" && name != "specdec") {
      return InvalidArgumentError(StrCat("--drafter: unknown drafter '", name,
                                         "' (none, ngram, draft-model, specformer, beagle, "
                                         "beagle-chain, parallelspec, parallelspec-chain, "
                                         "parallelspec-static, specdec)"));
    }
    names.push_back(name);
  }
  if (names.empty()) names.push_back("none");
  return names;
}

StatusOr<std::vector<std::unique_ptr<Drafter>>> SpecFlags::LoadDrafters(
    const ModelConfig& target, const ModelFlags& model, const ModelRunner* target_runner) const {
  ASSIGN_OR_RETURN(std::vector<std::string> names, DrafterNames());
  const int32_t vocab = static_cast<int32_t>(target.vocab_size);
  std::vector<std::unique_ptr<Drafter>> drafters;
  for (const std::string& name : names) {
    if (name == "ngram") {
      ASSIGN_OR_RETURN(auto ngram,
                       NgramDrafter::Create({.min_ngram = static_cast<int32_t>(ngram_min),
                                             .max_ngram = static_cast<int32_t>(ngram_max)}));
      drafters.push_back(std::move(ngram));
    } else if (name == "draft-model") {
      if (drafter_model.empty()) {
        return InvalidArgumentError("--drafter draft-model needs --drafter-model DIR");
      }
      ModelFlags draft = model;
      draft.model = drafter_model;
      auto runner = draft.Load();
      if (!runner.ok()) return runner.status().WithContext("--drafter-model");
      if (tree_width < 1) return InvalidArgumentError("--tree-width must be at least 1");
      ASSIGN_OR_RETURN(auto drafter,
                       DraftModelDrafter::Create(std::move(*runner), vocab,
                                                 {.tree_width = static_cast<int32_t>(tree_width)}));
      drafters.push_back(std::move(drafter));
    } else if (name == "specdec") {
      // Token-only: needs the target's config (the vocabulary it was distilled for), not its
      // weights, so it loads the same way in every role.
      if (specdec_model.empty()) {
        return InvalidArgumentError("--drafter specdec needs --specdec-model DIR");
      }
      auto drafter = SpecDecDrafter::Load(specdec_model, target,
                                          {.device = model.device, .dtype = model.dtype});
      if (!drafter.ok()) return drafter.status().WithContext("--specdec-model");
      drafters.push_back(std::move(*drafter));
    } else if (name != "none") {  // the drafters that share the target's weights
      const bool beagle = name == "beagle" || name == "beagle-chain";
      const bool parallelspec = name.rfind("parallelspec", 0) == 0;
      const char* family = beagle ? "beagle" : parallelspec ? "parallelspec" : "specformer";
      const std::string& dir = beagle         ? beagle_model
                               : parallelspec ? parallelspec_model
                                              : specformer_model;
      if (dir.empty()) {
        return InvalidArgumentError(StrCat("--drafter ", name, " needs --", family, "-model DIR"));
      }
      ParallelSpecDrafterOptions ps{.name = name};
      if (name == "parallelspec-chain") ps.shape = ParallelSpecShape::kChain;
      if (name == "parallelspec-static") {
        if (parallelspec_static_tree.empty()) {
          return InvalidArgumentError(
              "--drafter parallelspec-static needs --parallelspec-static-tree FILE");
        }
        auto tree = StaticDraftTree::FromFile(parallelspec_static_tree);
        if (!tree.ok()) return tree.status().WithContext("--parallelspec-static-tree");
        ps.shape = ParallelSpecShape::kStaticTree;
        ps.static_tree = std::move(*tree);
      }
      // SpecFormer and Beagle share the target's weights (head, embedding): a drafter process
      // without the target loads it (the drafter keeps only the shared module alive).
      std::unique_ptr<ModelRunner> own_target;
      if (!target_runner) {
        auto loaded = model.Load();
        if (!loaded.ok()) {
          return loaded.status().WithContext(StrCat("--model (", name, "'s target)"));
        }
        own_target = std::move(*loaded);
        target_runner = own_target.get();
      }
      if (beagle) {
        auto drafter =
            BeagleDrafter::Load(dir, *target_runner,
                                {.tree = name == "beagle",
                                 .depth = static_cast<int32_t>(beagle_depth),
                                 .top_k = static_cast<int32_t>(beagle_top_k),
                                 .total_tokens = static_cast<int32_t>(beagle_total_tokens),
                                 .concat = beagle_concat,
                                 .rank_temperature = static_cast<float>(beagle_rank_temperature),
                                 .name = name});
        if (!drafter.ok()) return drafter.status().WithContext("--beagle-model");
        drafters.push_back(std::move(*drafter));
      } else if (parallelspec) {
        auto drafter = ParallelSpecDrafter::Load(dir, *target_runner, std::move(ps));
        if (!drafter.ok()) return drafter.status().WithContext("--parallelspec-model");
        drafters.push_back(std::move(*drafter));
      } else {
        auto drafter = SpecFormerDrafter::Load(dir, *target_runner, {.tree = specformer_tree});
        if (!drafter.ok()) return drafter.status().WithContext("--specformer-model");
        drafters.push_back(std::move(*drafter));
      }
      // A target loaded only for this drafter dies here; the drafter holds the shared module.
      if (own_target) target_runner = nullptr;
    }
  }
  return drafters;
}

Status SpecFlags::AddDrafters(SpecEngine& engine, const ModelFlags& model) const {
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Drafter>> drafters,
                   LoadDrafters(engine.target().config(), model, &engine.target()));
  for (auto& d : drafters) RETURN_IF_ERROR(engine.AddDrafter(std::move(d)));
  return OkStatus();
}

StatusOr<SpeculationSettings> SpecFlags::Settings(const std::string& name, int64_t len,
                                                  double temperature) const {
  if (len < 0 || len > kMaxDraftTokens) {
    return InvalidArgumentError(
        StrCat("--draft-len must be in [0, ", kMaxDraftTokens, "], got ", len));
  }
  SpeculationSettings s;
  s.drafter = name;
  s.max_draft_tokens = static_cast<int32_t>(len);
  if (!verify.empty()) {
    auto mode = ParseVerifyMode(verify);
    if (!mode.ok()) return mode.status().WithContext("--verify");
    s.verify.mode = *mode;
    if (verify == "greedy" && temperature > 0) {
      return InvalidArgumentError("--verify greedy needs --temperature 0 (use --verify sample)");
    }
  }
  s.verify.specdec_beta = static_cast<int32_t>(beta);
  s.verify.specdec_tau = static_cast<float>(tau);
  s.verify.typical_epsilon = static_cast<float>(typical_epsilon);
  s.verify.typical_delta = static_cast<float>(typical_delta);
  RETURN_IF_ERROR(s.verify.Validate());
  return s;
}

StatusOr<std::unique_ptr<BudgetPlanner>> SpecFlags::MakePlanner(int64_t max_step_tokens) const {
  if (draft_cap < 1 || draft_cap > kMaxDraftTokens) {
    return InvalidArgumentError(
        StrCat("--draft-cap must be in [1, ", kMaxDraftTokens, "], got ", draft_cap));
  }
  auto planner = std::make_unique<BudgetPlanner>(DraftBudgetOptions{}, max_step_tokens);
  if (!cost_profile.empty()) {
    ASSIGN_OR_RETURN(auto points, LoadCostProfile(cost_profile));
    planner->policy().target_cost().WarmStart(points);
  }
  return planner;
}

StatusOr<std::vector<std::pair<StepShape, double>>> LoadCostProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError(StrCat("--cost-profile: cannot open ", path));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("results") || !j["results"].is_array()) {
    return InvalidArgumentError(
        StrCat("--cost-profile: ", path, " is not a `specula bench-forward --json` report"));
  }
  std::vector<std::pair<StepShape, double>> points;
  for (const auto& row : j["results"]) {
    if (!row.is_object() || !row.contains("tokens") || !row.contains("median_ms") ||
        !row.contains("context") || !row.contains("tokens_per_seq") || !row["tokens"].is_number() ||
        !row["median_ms"].is_number() || !row["context"].is_number() ||
        !row["tokens_per_seq"].is_number()) {
      return InvalidArgumentError(StrCat("--cost-profile: ", path,
                                         ": every result needs tokens, tokens_per_seq, context "
                                         "and median_ms"));
    }
    const double tokens = row["tokens"].get<double>();
    const double per_seq = row["tokens_per_seq"].get<double>();
    const double context = row["context"].get<double>();
    StepShape shape{.tokens = static_cast<int64_t>(tokens),
                    .attention = tokens * (context + per_seq)};
    points.push_back({shape, row["median_ms"].get<double>() / 1000.0});
  }
  if (points.empty()) return InvalidArgumentError(StrCat("--cost-profile: ", path, " is empty"));
  return points;
}

}  // namespace specula::cli
