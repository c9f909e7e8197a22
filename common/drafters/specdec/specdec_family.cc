// The SpecDec family: token-only (no hidden states, no shared weights), so it loads from the
// target's config alone, the same way in every role.
#include "common/drafters/drafter_registry.h"
#include "common/drafters/specdec/specdec_drafter.h"

namespace specula {
namespace {

class SpecDecFamily : public DrafterFamily {
 public:
  std::string family() const override { return "specdec"; }
  std::vector<DrafterVariant> Variants() const override {
    return {{"specdec", "deep-shallow non-autoregressive, token-only"}};
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.AddString("specdec-model", &dir_,
                    "SpecDec checkpoint directory for --drafter specdec (token-only)");
  }
  StatusOr<std::unique_ptr<Drafter>> Load(const std::string& name,
                                          DrafterLoadContext& context) const override {
    if (dir_.empty()) return InvalidArgumentError("--drafter specdec needs --specdec-model DIR");
    const ModelRunnerOptions& o = context.model_options();
    auto drafter =
        SpecDecDrafter::Load(dir_, context.target_config(), {.device = o.device, .dtype = o.dtype});
    if (!drafter.ok()) return drafter.status().WithContext("--specdec-model");
    return std::unique_ptr<Drafter>(std::move(*drafter));
  }
  nlohmann::json Settings() const override { return {{"model", dir_}}; }

 private:
  std::string dir_;
};

}  // namespace

std::unique_ptr<DrafterFamily> MakeSpecDecFamily() { return std::make_unique<SpecDecFamily>(); }

}  // namespace specula
