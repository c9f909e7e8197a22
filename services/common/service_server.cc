#include "services/common/service_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

namespace specula::services {

StatusOr<std::unique_ptr<ServiceServer>> ServiceServer::Start(
    const std::string& host, int port, grpc::Service* service, const std::string& service_name,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  std::unique_ptr<ServiceServer> s(new ServiceServer);
  // Both are process-wide switches that take effect for servers built afterwards.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = StrCat(host, ":", port);
  const bool tls = credentials != nullptr;
  if (!tls) credentials = grpc::InsecureServerCredentials();
  builder.AddListeningPort(address, credentials, &s->port_);
  builder.SetMaxReceiveMessageSize(-1);  // hidden states of long prompts
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(service);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return UnavailableError(StrCat("cannot listen on ", address,
                                   tls ? " (or the TLS key does not match its certificate)" : ""));
  }
  s->server_->GetHealthCheckService()->SetServingStatus(service_name, true);
  return s;
}

ServiceServer::~ServiceServer() { Shutdown(); }

void ServiceServer::Shutdown(std::chrono::milliseconds grace) {
  if (shut_down_ || !server_) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
}

}  // namespace specula::services
