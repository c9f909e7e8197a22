// The SpecFormer family: shares the target's final norm and lm_head, so it needs the target's
// weights (loaded once by the context in the drafter role).
#include "common/drafters/drafter_registry.h"
#include "common/drafters/specformer/specformer_drafter.h"

namespace specula {
namespace {

class SpecFormerFamily : public DrafterFamily {
 public:
  std::string family() const override { return "specformer"; }
  std::vector<DrafterVariant> Variants() const override {
    return {{"specformer", "all depths in one forward; --specformer-tree false for a chain"}};
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.AddString("specformer-model", &dir_,
                    "SpecFormer checkpoint directory for --drafter specformer");
    flags.AddBool("specformer-tree", &tree_,
                  "specformer: budgeted tree of the k most probable paths (false: argmax chain)");
  }
  StatusOr<std::unique_ptr<Drafter>> Load(const std::string& name,
                                          DrafterLoadContext& context) const override {
    if (dir_.empty()) {
      return InvalidArgumentError("--drafter specformer needs --specformer-model DIR");
    }
    ASSIGN_OR_RETURN(const ModelRunner* target, context.target(name));
    auto drafter =
        SpecFormerDrafter::Load(dir_, *target,
                                {.tree = tree_,
                                 .draft_vocab = context.draft_vocab(),
                                 .matmul = context.draft_matmul(),
                                 .packed_weights = context.model_options().packed_weights});
    if (!drafter.ok()) return drafter.status().WithContext("--specformer-model");
    return std::unique_ptr<Drafter>(std::move(*drafter));
  }
  nlohmann::json Settings() const override { return {{"model", dir_}, {"tree", tree_}}; }

 private:
  std::string dir_;
  bool tree_ = SpecFormerDrafterOptions{}.tree;
};

}  // namespace

std::unique_ptr<DrafterFamily> MakeSpecFormerFamily() {
  return std::make_unique<SpecFormerFamily>();
}

}  // namespace specula
