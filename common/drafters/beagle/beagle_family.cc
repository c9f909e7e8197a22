// The Beagle family: an EAGLE-2 dynamic tree (beagle) or an argmax chain (beagle-chain); shares
// the target's embedding and lm_head.
#include "common/drafters/beagle/beagle_drafter.h"
#include "common/drafters/drafter_registry.h"

namespace specula {
namespace {

class BeagleFamily : public DrafterFamily {
 public:
  std::string family() const override { return "beagle"; }
  std::vector<DrafterVariant> Variants() const override {
    return {{"beagle", "EAGLE-2 dynamic tree"}, {"beagle-chain", "Beagle, argmax chain"}};
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.AddString("beagle-model", &dir_,
                    "Beagle checkpoint directory for --drafter beagle / beagle-chain");
    flags.AddInt("beagle-depth", &depth_, "beagle: deepest drafted node");
    flags.AddInt("beagle-top-k", &top_k_,
                 "beagle: children per expanded node and frontier width (EAGLE-2 dynamic tree)");
    flags.AddInt("beagle-total-tokens", &total_tokens_,
                 "beagle: tree size cap (each step's draft budget caps it too)");
    flags.AddBool("beagle-concat", &concat_,
                  "beagle: drafted states as keys for deeper drafts (the paper's \"concate\")");
    flags.AddDouble("beagle-rank-temperature", &rank_temperature_,
                    "beagle: divides the drafter's logits when ranking tree nodes (< 1 = deeper "
                    "trees at small budgets; 1 = EAGLE-2)");
  }
  StatusOr<std::unique_ptr<Drafter>> Load(const std::string& name,
                                          DrafterLoadContext& context) const override {
    if (dir_.empty()) {
      return InvalidArgumentError(StrCat("--drafter ", name, " needs --beagle-model DIR"));
    }
    ASSIGN_OR_RETURN(const ModelRunner* target, context.target(name));
    auto drafter = BeagleDrafter::Load(dir_, *target,
                                       {.tree = name == "beagle",
                                        .depth = static_cast<int32_t>(depth_),
                                        .top_k = static_cast<int32_t>(top_k_),
                                        .total_tokens = static_cast<int32_t>(total_tokens_),
                                        .concat = concat_,
                                        .rank_temperature = static_cast<float>(rank_temperature_),
                                        .name = name,
                                        .draft_vocab = context.draft_vocab(),
                                        .matmul = context.draft_matmul(),
                                        .packed_weights = context.model_options().packed_weights});
    if (!drafter.ok()) return drafter.status().WithContext("--beagle-model");
    return std::unique_ptr<Drafter>(std::move(*drafter));
  }
  nlohmann::json Settings() const override {
    return {{"model", dir_},     {"depth", depth_},
            {"top_k", top_k_},   {"total_tokens", total_tokens_},
            {"concat", concat_}, {"rank_temperature", rank_temperature_}};
  }

 private:
  std::string dir_;
  int64_t depth_ = BeagleDrafterOptions{}.depth;
  int64_t top_k_ = BeagleDrafterOptions{}.top_k;
  int64_t total_tokens_ = BeagleDrafterOptions{}.total_tokens;
  bool concat_ = BeagleDrafterOptions{}.concat;
  double rank_temperature_ = BeagleDrafterOptions{}.rank_temperature;
};

}  // namespace

std::unique_ptr<DrafterFamily> MakeBeagleFamily() { return std::make_unique<BeagleFamily>(); }

}  // namespace specula
