#include "services/router/spec_decode_averages.h"

namespace specula::router {

void SpecDecodeAverages::AddStep(const StepReport& report, double predicted_speedup,
                                 double wall_seconds) {
  double tokens = 0, depth = 0, nodes = 0, drafting = 0;
  for (const RequestUpdate& u : report.updates) {
    if (u.draft_nodes <= 0) continue;
    tokens += u.draft_accepted + 1;
    depth += u.draft_depth;
    nodes += u.draft_nodes;
    ++drafting;
  }
  if (drafting > 0) {
    const double w = drafted_ ? kWeight : 1.0;
    kappa_ += w * ((tokens / drafting) * (depth / nodes) - kappa_);
    speedup_ += w * (predicted_speedup - speedup_);
    drafted_ = true;
  }
  if (wall_seconds > 0) {
    draft_share_ += kWeight * (report.draft_seconds / wall_seconds - draft_share_);
  }
}

}  // namespace specula::router
