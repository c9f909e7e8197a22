// The public API's optional bearer token (`specula serve --api-token-file PATH`, or the
// SPECULA_API_TOKEN environment variable): every call of the Generation service must carry the
// metadata `authorization: Bearer <token>`, else it ends with UNAUTHENTICATED before its request
// is read. Health checking and reflection stay open (probes carry no token). Without TLS
// (`--tls-cert`) the token crosses the network in clear text.
#pragma once

#include <grpcpp/server_context.h>

#include <string>
#include <string_view>

#include "common/util/status.h"

namespace specula::router {

inline constexpr char kApiTokenEnv[] = "SPECULA_API_TOKEN";

// True when `given` equals `expected`; the time taken depends only on expected.size(), never on
// where the two differ (nor on given's length).
bool ConstantTimeEquals(std::string_view expected, std::string_view given);

// The token from `path` (surrounding whitespace trimmed) or, when `path` is empty, from
// $SPECULA_API_TOKEN; "" when neither is set (no authentication). INVALID_ARGUMENT naming the flag
// when the file cannot be read, or the token is empty or holds anything but visible ASCII.
StatusOr<std::string> LoadApiToken(const std::string& path);

// Thread-safe (immutable).
class ApiTokenAuth {
 public:
  ApiTokenAuth() = default;  // off
  explicit ApiTokenAuth(std::string token) : token_(std::move(token)) {}
  bool enabled() const { return !token_.empty(); }
  // OK when off or when the call's `authorization` metadata is `Bearer <token>` (scheme
  // case-insensitive); UNAUTHENTICATED otherwise.
  grpc::Status Check(const grpc::ServerContextBase& context) const;

 private:
  std::string token_;
};

}  // namespace specula::router
