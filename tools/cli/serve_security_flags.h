// `specula serve`'s security flags: TLS on the public API (--tls-cert, --tls-key, --tls-ca),
// mutual TLS between router, target and drafter (--peer-tls-cert, --peer-tls-key, --peer-tls-ca)
// and the public API's bearer token (--api-token-file or $SPECULA_API_TOKEN). Files are read once
// at startup (Load); a changed certificate needs a restart.
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "common/util/flags.h"
#include "common/util/status.h"
#include "services/common/tls.h"

namespace specula::cli {

struct ServeSecurityFlags {
  services::TlsFiles tls;       // the public API (role all / router)
  services::TlsFiles peer_tls;  // router <-> target <-> drafter (roles router / target / drafter)
  std::string api_token_file;

  void Register(FlagSet& flags);
  // Checks the flags against `role` and reads the files into the fields below. INVALID_ARGUMENT
  // naming the flag.
  Status Load(const std::string& role);

  // Set by Load; null = insecure.
  std::shared_ptr<grpc::ServerCredentials> public_server;  // the router's public port
  std::shared_ptr<grpc::ServerCredentials> peer_server;    // the target's / drafter's port
  std::shared_ptr<grpc::ChannelCredentials> peer_channel;  // router -> target, target -> drafter
  std::string api_token;                                   // "" = no token
};

}  // namespace specula::cli
