// TLS credentials for Specula's gRPC servers and channels, from PEM files named by flags.
//
// Public API (`specula serve --role all|router`): `--tls-cert` + `--tls-key` turn on TLS;
// `--tls-ca` additionally requires every client to present a certificate signed by that CA.
// Between the services (`--role router|target|drafter`): `--peer-tls-cert`, `--peer-tls-key` and
// `--peer-tls-ca`, all three or none, give mutual TLS: the target and drafter servers require a
// client certificate signed by the CA, and the router's and target's channels verify the server
// against the same CA and present their own certificate.
//
// Every error is INVALID_ARGUMENT and names the flag (`--tls-key: cannot read '/x': ...`).
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "common/util/status.h"

namespace specula::services {

struct TlsFiles {
  std::string cert;  // PEM certificate chain
  std::string key;   // PEM private key of the certificate
  std::string ca;    // PEM bundle of trusted CAs
  bool empty() const { return cert.empty() && key.empty() && ca.empty(); }
};

// The PEM contents behind TlsFiles.
struct TlsPem {
  std::string cert;
  std::string key;
  std::string ca;
};

// Reads and checks the files. `flag_prefix` names the flags in errors ("tls" -> --tls-cert).
// `require_all`: cert, key and CA must all be given (mutual TLS); otherwise cert and key go
// together and the CA is optional but needs them.
StatusOr<TlsPem> LoadTlsFiles(const TlsFiles& files, const std::string& flag_prefix,
                              bool require_all);

// TLS server credentials; with a CA, clients must present a certificate it signed.
std::shared_ptr<grpc::ServerCredentials> TlsServerCredentials(const TlsPem& pem);
// TLS channel credentials: the server is verified against `pem.ca` (the system's roots when
// empty), and `pem.cert` + `pem.key` are presented when given.
std::shared_ptr<grpc::ChannelCredentials> TlsChannelCredentials(const TlsPem& pem);

}  // namespace specula::services
