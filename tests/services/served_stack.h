// The target and its drafters behind either transport, for tests that must pass on both:
//   kInProcess  LocalTargetBackend with local drafters (`specula serve --role all`);
//   kGrpc       the Drafter and Target services on 127.0.0.1 (free ports), the target reaching
//               its drafters through RemoteDrafter and the router reaching the target through
//               RemoteTargetBackend (`--role drafter`, `--role target`, `--role router`).
#pragma once

#include <memory>
#include <string>

#include "common/spec/local_target_backend.h"
#include "services/common/service_server.h"
#include "services/drafter/drafter_service.h"
#include "services/router/engine_loop.h"
#include "services/target/target_service.h"

namespace specula {

enum class Transport { kInProcess, kGrpc };
std::string TransportName(Transport t);

class ServedStack {
 public:
  // Builds the stack on the tiny served model (tests/services/served_test_model.h); `draft_dir`
  // empty = the n-gram drafter only.
  ServedStack(Transport transport, const std::string& target_dir, const std::string& draft_dir,
              SpecEngineOptions engine = {}, KvCacheOptions kv = {});
  ~ServedStack();

  // The model for the router (once).
  router::ServedModel TakeModel();

  // kGrpc only: the services, to stop or inspect them.
  drafter::DrafterService* drafter_service() { return drafter_service_.get(); }
  target::TargetService* target_service() { return target_service_.get(); }
  // Stops the drafter server (a dead drafter process) / starts a fresh one on the same port.
  void StopDrafter();
  void RestartDrafter();
  void StopTarget();

 private:
  std::string target_dir_;
  std::string draft_dir_;
  int drafter_port_ = 0;
  router::ServedModel model_;
  std::unique_ptr<drafter::DrafterService> drafter_service_;
  std::unique_ptr<services::ServiceServer> drafter_server_;
  std::unique_ptr<LocalTargetBackend> target_;
  std::unique_ptr<target::TargetService> target_service_;
  std::unique_ptr<services::ServiceServer> target_server_;
};

}  // namespace specula
