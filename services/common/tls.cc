#include "services/common/tls.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace specula::services {
namespace {

// Reads a PEM file; `what` must appear as a PEM block label ("CERTIFICATE", "PRIVATE KEY").
StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag,
                              const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return InvalidArgumentError(
        StrCat("--", flag, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  std::string pem = bytes.str();
  if (pem.find("-----BEGIN ") == std::string::npos ||
      pem.find(what + "-----") == std::string::npos) {
    return InvalidArgumentError(StrCat("--", flag, ": '", path, "' holds no PEM ", what,
                                       " (-----BEGIN ... ", what, "-----)"));
  }
  return pem;
}

}  // namespace

StatusOr<TlsPem> LoadTlsFiles(const TlsFiles& files, const std::string& flag_prefix,
                              bool require_all) {
  const std::string p = flag_prefix;
  if (require_all) {
    if (!files.empty() && (files.cert.empty() || files.key.empty() || files.ca.empty())) {
      return InvalidArgumentError(StrCat("--", p, "-cert, --", p, "-key and --", p,
                                         "-ca go together (mutual TLS): give all three or none"));
    }
  } else {
    if (files.cert.empty() != files.key.empty()) {
      return InvalidArgumentError(StrCat("--", p, "-cert and --", p, "-key go together"));
    }
    if (!files.ca.empty() && files.cert.empty()) {
      return InvalidArgumentError(
          StrCat("--", p, "-ca (client certificates) needs --", p, "-cert and --", p, "-key"));
    }
  }
  TlsPem pem;
  if (!files.cert.empty()) {
    ASSIGN_OR_RETURN(pem.cert, ReadPem(files.cert, p + "-cert", "CERTIFICATE"));
  }
  if (!files.key.empty()) {
    ASSIGN_OR_RETURN(pem.key, ReadPem(files.key, p + "-key", "PRIVATE KEY"));
  }
  if (!files.ca.empty()) {
    ASSIGN_OR_RETURN(pem.ca, ReadPem(files.ca, p + "-ca", "CERTIFICATE"));
  }
  return pem;
}

std::shared_ptr<grpc::ServerCredentials> TlsServerCredentials(const TlsPem& pem) {
  grpc::SslServerCredentialsOptions options(
      pem.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                     : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = pem.ca;
  options.pem_key_cert_pairs.push_back({pem.key, pem.cert});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> TlsChannelCredentials(const TlsPem& pem) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pem.ca;
  options.pem_private_key = pem.key;
  options.pem_cert_chain = pem.cert;
  return grpc::SslCredentials(options);
}

}  // namespace specula::services
