// The router <-> target contract's types (step_contract.h) <-> target.proto's messages. Torch-free:
// the router uses it without LibTorch. Decoding validates what a peer could get wrong (array
// lengths, enum values) and names the field.
#pragma once

#include <string>

#include "common/spec/step_contract.h"
#include "common/util/status.h"
#include "specula/v1/target.pb.h"

namespace specula::services {

v1::VerifyMode ToProto(VerifyMode mode);
StatusOr<VerifyMode> FromProto(v1::VerifyMode mode, const std::string& field);

void ToProto(const SamplingParams& params, v1::SamplingParams* out);
SamplingParams FromProto(const v1::SamplingParams& params);

void ToProto(const SpecRequest& request, v1::EngineRequest* out);
StatusOr<SpecRequest> FromProto(const v1::EngineRequest& request, const std::string& field);

void ToProto(const StepPlan& plan, v1::StepPlan* out);
StatusOr<StepPlan> FromProto(const v1::StepPlan& plan);

void ToProto(const StepOutcome& outcome, v1::StepResult* out);
StepOutcome FromProto(const v1::StepResult& result);

void ToProto(const TargetInfo& info, v1::TargetInfo* out);
TargetInfo FromProto(const v1::TargetInfo& info);

}  // namespace specula::services
