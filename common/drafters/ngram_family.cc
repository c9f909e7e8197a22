// The n-gram (prompt lookup) family: no weights, one variant.
#include <limits>

#include "common/drafters/drafter_registry.h"
#include "common/drafters/ngram_drafter.h"

namespace specula {
namespace {

class NgramFamily : public DrafterFamily {
 public:
  std::string family() const override { return "ngram"; }
  std::vector<DrafterVariant> Variants() const override {
    return {{"ngram", "prompt lookup, no weights"}};
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.AddInt("ngram-min", &min_, "ngram: shortest suffix to match");
    flags.AddInt("ngram-max", &max_, "ngram: longest suffix to match");
    flags.AddInt("ngram-repeat-min-match", &repeat_min_match_,
                 "ngram: a continuation that runs up to the last token repeats past it when the "
                 "match behind it is at least this long (0 = never)");
  }
  StatusOr<std::unique_ptr<Drafter>> Load(const std::string& name,
                                          DrafterLoadContext& context) const override {
    if (repeat_min_match_ < 0 || repeat_min_match_ > std::numeric_limits<int32_t>::max()) {
      return InvalidArgumentError(
          StrCat("--ngram-repeat-min-match must be >= 0 (0 = never), got ", repeat_min_match_));
    }
    ASSIGN_OR_RETURN(
        auto drafter,
        NgramDrafter::Create({.min_ngram = static_cast<int32_t>(min_),
                              .max_ngram = static_cast<int32_t>(max_),
                              .vocab_size = context.target_config().vocab_size,
                              .repeat_min_match = static_cast<int32_t>(repeat_min_match_)}));
    return std::unique_ptr<Drafter>(std::move(drafter));
  }
  nlohmann::json Settings() const override {
    return {{"min", min_}, {"max", max_}, {"repeat_min_match", repeat_min_match_}};
  }

 private:
  int64_t min_ = NgramDrafterOptions{}.min_ngram;
  int64_t max_ = NgramDrafterOptions{}.max_ngram;
  int64_t repeat_min_match_ = NgramDrafterOptions{}.repeat_min_match;
};

}  // namespace

std::unique_ptr<DrafterFamily> MakeNgramFamily() { return std::make_unique<NgramFamily>(); }

}  // namespace specula
