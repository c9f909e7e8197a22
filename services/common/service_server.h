// A gRPC server for an internal service (target, drafter): the service plus health checking
// (grpc.health.v1, SERVING for "" and the service's name) and reflection; insecure, or mutual TLS
// with credentials from TlsServerCredentials (services/common/tls.h).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/util/status.h"

namespace specula::services {

class ServiceServer {
 public:
  // Listens on host:port (0 = any free port); `credentials` null = insecure. UNAVAILABLE if the
  // port cannot be bound (or the TLS key does not match its certificate).
  static StatusOr<std::unique_ptr<ServiceServer>> Start(
      const std::string& host, int port, grpc::Service* service, const std::string& service_name,
      std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);
  ~ServiceServer();  // Shutdown()

  int port() const { return port_; }
  // NOT_SERVING, then stops the server, cancelling open streams after `grace`. Idempotent.
  void Shutdown(std::chrono::milliseconds grace = std::chrono::milliseconds(500));

 private:
  ServiceServer() = default;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace specula::services
