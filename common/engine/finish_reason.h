// Why a request ended: the one list every layer speaks (decoders, SpecEngine's step reports, the
// Target service's wire format, the router's events, metrics and logs). Torch-free, header-only.
#pragma once

#include <ostream>
#include <string>
#include <string_view>

#include "common/util/status.h"

namespace specula {

enum class FinishReason {
  kStop,        // an end-of-sequence token or a requested stop token id
  kLength,      // max_new_tokens or the context length
  kStopString,  // a stop string appeared in the text (the router's detokenizer decides this)
  kCancelled,   // the client cancelled, the deadline passed, or the server shut down
  kError,       // the engine failed (the request's Status says why)
};

// Every reason, in declaration order (metric label sets, tests).
inline constexpr FinishReason kAllFinishReasons[] = {
    FinishReason::kStop, FinishReason::kLength, FinishReason::kStopString, FinishReason::kCancelled,
    FinishReason::kError};

// "stop", "length", "stop_string", "cancelled", "error": the names on the Target service's wire
// (EngineUpdate.finish_reason), in metric labels, logs and the CLI's JSON.
constexpr const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

// The reason FinishReasonName names; INVALID_ARGUMENT naming the known names for anything else.
inline StatusOr<FinishReason> ParseFinishReason(std::string_view name) {
  std::string known;
  for (FinishReason r : kAllFinishReasons) {
    if (name == FinishReasonName(r)) return r;
    known += known.empty() ? "" : ", ";
    known += FinishReasonName(r);
  }
  return InvalidArgumentError(
      StrCat("unknown finish reason '", std::string(name), "' (known: ", known, ")"));
}

inline std::ostream& operator<<(std::ostream& os, FinishReason reason) {
  return os << FinishReasonName(reason);
}

}  // namespace specula
