// The conformance suite with each drafter in process, as `specula serve --role all` runs it.
#include "tests/drafters/drafter_conformance.h"

namespace specula {
namespace {

class LocalProvider : public DrafterProvider {
 public:
  bool remote() const override { return false; }
  std::unique_ptr<Drafter> Provide(std::unique_ptr<Drafter> drafter, const ModelRunner&) override {
    return drafter;
  }
};

}  // namespace

std::unique_ptr<DrafterProvider> MakeConformanceProvider() {
  return std::make_unique<LocalProvider>();
}

}  // namespace specula
