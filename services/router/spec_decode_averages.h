// The speculation figures the router's metrics show as recent averages (SpecFormer's notation):
//   kappa = a * depth / k   over the sequences that drafted (a: tokens a drafting sequence gained
//                           in its step, accepted drafts + the bonus; k: nodes verified),
//   theta = kappa / speedup the predicted speedup of the steps that drafted (lower is better),
//   the drafters' share of the step's wall time, over all steps.
// kappa and theta move only on steps that drafted: a step without drafts has speedup 1 by
// definition and says nothing about either. Torch-free.
#pragma once

#include "common/spec/step_contract.h"

namespace specula::router {

class SpecDecodeAverages {
 public:
  // Weight of the newest step in each average.
  static constexpr double kWeight = 0.05;

  // One step's report, the speedup its budgets were predicted to give, and its wall time.
  void AddStep(const StepReport& report, double predicted_speedup, double wall_seconds);

  double kappa() const { return kappa_; }
  double theta() const { return speedup_ > 0 ? kappa_ / speedup_ : 0; }
  double draft_share() const { return draft_share_; }

 private:
  double kappa_ = 0, speedup_ = 0, draft_share_ = 0;
  bool drafted_ = false;  // the first drafting step seeds kappa and speedup (no pull to 0)
};

}  // namespace specula::router
