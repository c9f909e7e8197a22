// How often a drafter's node is accepted (its ancestors accepted) by the probability the drafter
// gave it, so that a drafter with a distribution per node (the draft LM) can estimate each node's
// reach and stop where the next one is not worth its forward or its verified row
// (DraftRequest::min_reach, depth_reach).
//
// A self-distilled draft LM is close to calibrated on its own: on the bundled model at batch 1
// (greedy, fixed k = 8), nodes it gave 0.35-0.5 were accepted 50% of the time, 0.65-0.8 81%,
// 0.97+ 99.8%; below 0.2, 29%. A draft model that was not distilled need not be, and sampled
// nodes are accepted with probability min(1, p/q), not q: so the table is measured
// (DraftOutcomes), starting from the drafter's own probability.
#pragma once

#include <array>
#include <cstdint>

namespace specula {

class ConfidenceCalibration {
 public:
  static constexpr int32_t kBins = 12;

  // The bin of a node the drafter gave probability `prob` (clamped to [0, 1]).
  static int32_t BinOf(double prob);
  // A trial: a node of bin `bin` whose ancestors were accepted was (not) accepted.
  void Record(int32_t bin, bool accepted);
  // P(a node of the bin is accepted | its ancestors were): the bin's counts, shrunk towards its
  // middle probability (kPriorWeight samples).
  double Conditional(int32_t bin) const;
  // The same over every bin: what a node not drafted yet is expected to be (1/2 until measured).
  double Average() const;

 private:
  // Counts halve once a bin has kWindow trials: the table follows the recent text.
  static constexpr double kWindow = 1024;
  static constexpr double kPriorWeight = 4;
  std::array<double, kBins> trials_{}, hits_{};
};

}  // namespace specula
