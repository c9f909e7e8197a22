#include "common/drafters/draft_outcomes.h"

#include <algorithm>
#include <utility>

namespace specula {

void DraftOutcomes::Proposed(int64_t at, std::vector<int32_t> chain, std::vector<int32_t> classes) {
  if (chain.empty() || classes.empty()) return;
  if (chain.size() > kMaxDepth) chain.resize(kMaxDepth);
  classes.resize(chain.size(), classes.back());
  std::erase_if(pending_, [&](const Pending& p) { return p.at == at; });
  if (pending_.size() >= kMaxPending) pending_.erase(pending_.begin());
  pending_.push_back({.at = at, .chain = std::move(chain), .classes = std::move(classes)});
}

void DraftOutcomes::Committed(int64_t position, int32_t token, const Record& record) {
  std::erase_if(pending_, [&](Pending& p) {
    if (position != p.at + p.matched) return position > p.at + p.matched;  // stale: drop it
    const bool accepted = p.chain[p.matched] == token;
    record(p.classes[p.matched], p.matched + 1, accepted);
    if (!accepted) return true;
    return ++p.matched == static_cast<int32_t>(p.chain.size());
  });
}

}  // namespace specula
