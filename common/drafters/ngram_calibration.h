// How often an n-gram draft's tokens are accepted, by how long the match behind the draft is, so
// that a proposal can stop where its next node is not worth verifying (DraftRequest::min_reach).
//
// Measured without bias from what the target went on to generate: every proposal's continuation
// (up to kDepth tokens, whatever was proposed of it) is compared with the tokens committed after
// it (DraftOutcomes). Trimming a proposal does not change what is measured, so the table needs no
// exploration.
//
// On the bundled model at batch 1 (fixed k = 8): a 1-token match's first token is accepted 37% of
// the time and its fourth is reached 10%; a match of 8+ tokens reaches its fourth 94%.
#pragma once

#include <array>
#include <cstdint>

namespace specula {

class NgramCalibration {
 public:
  static constexpr int32_t kDepth = 16;   // positions measured; deeper ones use the last
  static constexpr int32_t kClasses = 5;  // match lengths 1, 2, 3-4, 5-7, 8+
  static constexpr int32_t kLongMatch = 8;

  // The class of a draft whose match (the suffix that occurred before, extended backwards) is
  // `match` tokens long (>= 1; at most kLongMatch needs to be measured).
  static int32_t ClassOf(int64_t match);

  // A trial: position j (1-based) of a class-`cls` draft, its 1..j-1 accepted.
  void Record(int32_t cls, int32_t j, bool accepted);
  // P(position j accepted | 1..j-1 were) for the class: its counts, shrunk towards all classes'
  // average at j (kPriorWeight samples), which starts at 1/2.
  double Conditional(int32_t cls, int32_t j) const;
  // How many of a class-`cls` chain's first `len` nodes to keep: up to the last whose estimated
  // reach (the product of the conditionals up to it) is at least min_reach (<= 0: all).
  int32_t Keep(int32_t cls, int32_t len, double min_reach) const;

 private:
  // Counts halve once a cell has kWindow trials: the table follows the recent text.
  static constexpr double kWindow = 1024;
  static constexpr double kPriorWeight = 4;
  std::array<std::array<double, kDepth + 1>, kClasses> trials_{}, hits_{};
};

}  // namespace specula
