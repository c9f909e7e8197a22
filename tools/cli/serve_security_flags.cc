#include "tools/cli/serve_security_flags.h"

#include "services/router/api_token.h"

namespace specula::cli {

void ServeSecurityFlags::Register(FlagSet& flags) {
  flags.AddString("tls-cert", &tls.cert,
                  "router/all: PEM certificate chain; with --tls-key the public API speaks TLS");
  flags.AddString("tls-key", &tls.key, "router/all: PEM private key of --tls-cert");
  flags.AddString("tls-ca", &tls.ca,
                  "router/all: PEM CA bundle; clients must present a certificate it signed");
  flags.AddString("peer-tls-cert", &peer_tls.cert,
                  "router/target/drafter: PEM certificate for mutual TLS between the services "
                  "(with --peer-tls-key and --peer-tls-ca, all three or none)");
  flags.AddString("peer-tls-key", &peer_tls.key,
                  "router/target/drafter: PEM private key of --peer-tls-cert");
  flags.AddString("peer-tls-ca", &peer_tls.ca,
                  "router/target/drafter: PEM CA bundle that signed every service's certificate");
  flags.AddString("api-token-file", &api_token_file,
                  StrCat("router/all: file holding a bearer token every Generation call must send "
                         "as 'authorization: Bearer <token>' (else UNAUTHENTICATED; health stays "
                         "open); default: $",
                         router::kApiTokenEnv, " if set"));
}

Status ServeSecurityFlags::Load(const std::string& role) {
  const bool public_api = role == "all" || role == "router";
  if (!public_api && !tls.empty()) {
    return InvalidArgumentError(StrCat(
        "--tls-cert/--tls-key/--tls-ca are for the public API (--role all or router); --role ",
        role, " uses --peer-tls-cert/--peer-tls-key/--peer-tls-ca"));
  }
  if (!public_api && !api_token_file.empty()) {
    return InvalidArgumentError("--api-token-file is for the public API (--role all or router)");
  }
  if (role == "all" && !peer_tls.empty()) {
    return InvalidArgumentError(
        "--peer-tls-cert/--peer-tls-key/--peer-tls-ca are for the split deployment (--role "
        "router, target or drafter); --role all has no internal connections");
  }
  if (public_api) {
    ASSIGN_OR_RETURN(services::TlsPem pem, services::LoadTlsFiles(tls, "tls", false));
    if (!tls.empty()) public_server = services::TlsServerCredentials(pem);
    ASSIGN_OR_RETURN(api_token, router::LoadApiToken(api_token_file));
  }
  ASSIGN_OR_RETURN(services::TlsPem peer, services::LoadTlsFiles(peer_tls, "peer-tls", true));
  if (!peer_tls.empty()) {
    peer_server = services::TlsServerCredentials(peer);
    peer_channel = services::TlsChannelCredentials(peer);
  }
  return OkStatus();
}

}  // namespace specula::cli
