// The transport seam between the router and the target: the router plans each engine step
// (which requests join the batch, which leave, each sequence's draft budget) and the target runs it
// and reports the tokens every sequence produced. Two implementations run the same router code:
// LocalTargetBackend (in process, `specula serve --role all`) and the gRPC client of the Target
// service (services/router/remote_target_backend.h, `--role router`).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/spec/step_contract.h"
#include "common/util/status.h"

namespace specula {

class TargetBackend {
 public:
  virtual ~TargetBackend() = default;

  virtual TargetInfo info() const = 0;
  // One step in two halves: StartStep sends the plan (or hands it to the engine's own thread) and
  // returns; FinishStep waits for the step's outcome. One step at a time: StartStep again only
  // after FinishStep. The halves let the router plan the next step as soon as a step ends and
  // deliver that step's tokens (detokenize, match stop strings, stream) while the next one runs.
  // A request the target refuses (e.g. a drafter it does not have) finishes in the report with
  // FinishReason::kError. A non-OK status means the step did not run: the target is unreachable
  // (UNAVAILABLE) or broken, and every request it held is lost.
  virtual void StartStep(StepPlan plan) = 0;
  virtual StatusOr<StepOutcome> FinishStep() = 0;

  // StartStep, then FinishStep.
  StatusOr<StepOutcome> Step(StepPlan plan) {
    StartStep(std::move(plan));
    return FinishStep();
  }
};

}  // namespace specula
