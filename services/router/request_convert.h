// Conversions between the public API's messages (proto/specula/v1/generation.proto) and the engine
// loop's types, including request validation with the API's field names and server defaults.
#pragma once

#include <grpcpp/support/status.h>

#include "common/tokenizer/tokenizer.h"
#include "common/util/status.h"
#include "services/common/engine_codec.h"
#include "services/common/grpc_status.h"
#include "services/router/engine_loop.h"
#include "specula/v1/generation.pb.h"

namespace specula::router {

// The request in the engine's terms: prompt tokenized, sampling and speculation defaults resolved
// from `info` (drafter "" -> info.default_drafter, max_draft_tokens 0 -> the default, unset
// max_new_tokens -> the rest of the context, unset seed -> a random one, unset lossy-rule
// parameters -> info.verify_defaults), the model's EOS ids added
// to the stop tokens unless ignore_eos. INVALID_ARGUMENT / OUT_OF_RANGE with a message that starts
// with the field's name (e.g. "token_ids[2] = 70000 is outside the vocabulary [0, 4096)",
// "sampling.top_p must be in (0, 1], got 0"). The deadline is left unset.
StatusOr<LoopRequest> ToLoopRequest(const v1::GenerateRequest& request, const EngineInfo& info,
                                    const Tokenizer& tokenizer);

v1::FinishReason ToProto(FinishReason reason);
using services::ToProto;  // VerifyMode
void FillSpecStats(const SpeculationSettings& settings, const SpecRequestStats& stats,
                   v1::SpecStats* out);
void FillServerInfo(const EngineInfo& info, const LoadSnapshot& load, v1::ServerInfo* out);

using services::ToGrpcStatus;

}  // namespace specula::router
