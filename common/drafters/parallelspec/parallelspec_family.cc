// The ParallelSpec family: k + 1 drafts from one forward, as a budgeted best-first tree
// (parallelspec), a chain (parallelspec-chain) or a static Medusa tree (parallelspec-static), and
// the same network drafting autoregressively (parallelspec-ar: the paper's trade-off, measured);
// shares the target's embedding and lm_head.
#include "common/drafters/drafter_registry.h"
#include "common/drafters/parallelspec/parallelspec_drafter.h"

namespace specula {
namespace {

class ParallelSpecFamily : public DrafterFamily {
 public:
  std::string family() const override { return "parallelspec"; }
  std::vector<DrafterVariant> Variants() const override {
    return {{"parallelspec", "budgeted tree"},
            {"parallelspec-chain", "ParallelSpec, chain"},
            {"parallelspec-static", "ParallelSpec, static Medusa tree"},
            {"parallelspec-ar", "ParallelSpec's network drafting autoregressively (baseline)"}};
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.AddString("parallelspec-model", &dir_,
                    "ParallelSpec checkpoint directory for --drafter parallelspec / "
                    "parallelspec-chain / parallelspec-static / parallelspec-ar");
    flags.AddString("parallelspec-static-tree", &static_tree_,
                    "parallelspec-static: JSON array of rank paths, e.g. [[0], [1], [0, 0]]");
  }
  StatusOr<std::unique_ptr<Drafter>> Load(const std::string& name,
                                          DrafterLoadContext& context) const override {
    if (dir_.empty()) {
      return InvalidArgumentError(StrCat("--drafter ", name, " needs --parallelspec-model DIR"));
    }
    ParallelSpecDrafterOptions options{.name = name};
    options.draft_vocab = context.draft_vocab();
    options.matmul = context.draft_matmul();
    options.packed_weights = context.model_options().packed_weights;
    if (name == "parallelspec-chain") options.shape = ParallelSpecShape::kChain;
    if (name == "parallelspec-ar") options.shape = ParallelSpecShape::kAutoregressive;
    if (name == "parallelspec-static") {
      if (static_tree_.empty()) {
        return InvalidArgumentError(
            "--drafter parallelspec-static needs --parallelspec-static-tree FILE");
      }
      auto tree = StaticDraftTree::FromFile(static_tree_);
      if (!tree.ok()) return tree.status().WithContext("--parallelspec-static-tree");
      options.shape = ParallelSpecShape::kStaticTree;
      options.static_tree = std::move(*tree);
    }
    ASSIGN_OR_RETURN(const ModelRunner* target, context.target(name));
    auto drafter = ParallelSpecDrafter::Load(dir_, *target, std::move(options));
    if (!drafter.ok()) return drafter.status().WithContext("--parallelspec-model");
    return std::unique_ptr<Drafter>(std::move(*drafter));
  }
  nlohmann::json Settings() const override {
    return {{"model", dir_}, {"static_tree", static_tree_}};
  }

 private:
  std::string dir_;
  std::string static_tree_;
};

}  // namespace

std::unique_ptr<DrafterFamily> MakeParallelSpecFamily() {
  return std::make_unique<ParallelSpecFamily>();
}

}  // namespace specula
