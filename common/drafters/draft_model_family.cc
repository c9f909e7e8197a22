// The standalone draft LM family: a small CausalLM with the target's vocabulary, loaded with the
// serving device, dtype and KV settings; a chain or a top-w tree.
#include "common/drafters/draft_model_drafter.h"
#include "common/drafters/drafter_registry.h"

namespace specula {
namespace {

class DraftModelFamily : public DrafterFamily {
 public:
  std::string family() const override { return "draft-model"; }
  std::vector<DrafterVariant> Variants() const override {
    return {{"draft-model", "a small LM; --tree-width > 1 drafts a tree"}};
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.AddString("drafter-model", &dir_, "draft LM directory for --drafter draft-model");
    flags.AddInt("tree-width", &tree_width_,
                 "draft-model: 1 = chain, w > 1 = tree of top-w children");
    flags.AddInt("draft-model-context", &context_,
                 "draft-model: the most recent tokens of a sequence the draft LM reads when it "
                 "starts (or restarts) it, instead of catching up on all of them (0 = all that "
                 "fit its context; longer sequences restart from their recent tokens)");
  }
  StatusOr<std::unique_ptr<Drafter>> Load(const std::string& name,
                                          DrafterLoadContext& context) const override {
    if (dir_.empty())
      return InvalidArgumentError("--drafter draft-model needs --drafter-model DIR");
    if (tree_width_ < 1) return InvalidArgumentError("--tree-width must be at least 1");
    if (context_ < 0) {
      return InvalidArgumentError("--draft-model-context must be at least 0 (0 = all)");
    }
    ModelRunnerOptions options = context.model_options();
    options.draft_matmul = context.draft_matmul();
    auto runner = ModelRunner::Load(dir_, options);
    if (!runner.ok()) return runner.status().WithContext("--drafter-model");
    ASSIGN_OR_RETURN(auto drafter, DraftModelDrafter::Create(
                                       std::move(*runner),
                                       static_cast<int32_t>(context.target_config().vocab_size),
                                       {.tree_width = static_cast<int32_t>(tree_width_),
                                        .draft_vocab = context.draft_vocab(),
                                        .context = context_}));
    return std::unique_ptr<Drafter>(std::move(drafter));
  }
  nlohmann::json Settings() const override {
    return {{"model", dir_}, {"tree_width", tree_width_}, {"context", context_}};
  }

 private:
  std::string dir_;
  int64_t tree_width_ = DraftModelDrafterOptions{}.tree_width;
  int64_t context_ = DraftModelDrafterOptions{}.context;
};

}  // namespace

std::unique_ptr<DrafterFamily> MakeDraftModelFamily() {
  return std::make_unique<DraftModelFamily>();
}

}  // namespace specula
