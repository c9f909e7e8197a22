// Conversions between the public API's messages (proto/specula/v1/generation.proto) and the engine
// loop's types, including request validation with the API's field names and server defaults.
#pragma once

#include <google/protobuf/descriptor.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <string_view>

#include "common/tokenizer/tokenizer.h"
#include "common/util/status.h"
#include "services/common/grpc_status.h"
#include "services/common/step_codec.h"
#include "services/router/engine_loop.h"
#include "specula/v1/generation.pb.h"

namespace specula::router {

// The request in the engine's terms: prompt tokenized, sampling and speculation defaults resolved
// from `info` (drafter "" -> info.default_drafter, max_draft_tokens 0 -> the default, unset
// max_new_tokens -> the rest of the context, unset seed -> a random one, unset lossy-rule
// parameters -> info.verify_defaults), the model's EOS ids added
// to the stop tokens unless ignore_eos. INVALID_ARGUMENT / OUT_OF_RANGE with a message that starts
// with the field's name (e.g. "token_ids[2] = 70000 is outside the vocabulary [0, 4096)",
// "sampling.top_p must be in (0, 1], got 0"). A `text` longer than `max_prompt_bytes` or that is
// not valid UTF-8 is refused (INVALID_ARGUMENT) before it is tokenized. The deadline is left
// unset.
inline constexpr int64_t kDefaultMaxPromptBytes = int64_t{1} << 20;
StatusOr<LoopRequest> ToLoopRequest(const v1::GenerateRequest& request, const EngineInfo& info,
                                    const Tokenizer& tokenizer,
                                    int64_t max_prompt_bytes = kDefaultMaxPromptBytes);

// Where `bytes` is not UTF-8 (RFC 3629: no overlong forms, surrogates or code points past
// U+10FFFF): the offset of the first bad byte, or -1 if it is valid.
int64_t FirstInvalidUtf8(std::string_view bytes);

// Why `bytes` (a serialized message of type `descriptor`) does not parse: INVALID_ARGUMENT naming
// the first string field that is not valid UTF-8 (proto3 strings must be; protobuf refuses the
// whole message otherwise, and gRPC would answer INTERNAL with no message), e.g. "text is not
// valid UTF-8 (byte 3)" or "stop[1] is not valid UTF-8 (byte 0)"; else INVALID_ARGUMENT
// "malformed message".
Status DiagnoseUnparsable(const google::protobuf::Descriptor* descriptor, std::string_view bytes);

v1::FinishReason ToProto(FinishReason reason);
using services::ToProto;  // VerifyMode
void FillSpecStats(const SpeculationSettings& settings, const SpecRequestStats& stats,
                   v1::SpecStats* out);
void FillServerInfo(const EngineInfo& info, const LoadSnapshot& load, v1::ServerInfo* out);

using services::ToGrpcStatus;

}  // namespace specula::router
