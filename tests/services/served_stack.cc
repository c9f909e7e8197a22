#include "tests/services/served_stack.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "services/router/remote_target_backend.h"
#include "services/target/remote_drafter.h"
#include "tests/services/served_test_model.h"

namespace specula {

std::string TransportName(Transport t) { return t == Transport::kGrpc ? "Grpc" : "InProcess"; }

namespace {

std::unique_ptr<drafter::DrafterService> MakeDrafterService(const std::string& target_dir,
                                                            const std::string& draft_dir) {
  auto config = ModelConfig::FromFile(target_dir + "/config.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return std::make_unique<drafter::DrafterService>(
      LoadTestDrafters(target_dir, draft_dir),
      drafter::DrafterServiceOptions{.vocab_size = static_cast<int32_t>(config->vocab_size),
                                     .hidden_size = static_cast<int32_t>(config->hidden_size),
                                     .dtype = "float32"});
}

}  // namespace

ServedStack::ServedStack(Transport transport, const std::string& target_dir,
                         const std::string& draft_dir, SpecEngineOptions engine, KvCacheOptions kv)
    : target_dir_(target_dir), draft_dir_(draft_dir) {
  if (transport == Transport::kInProcess) {
    model_ = LoadServedModel(target_dir, draft_dir, engine, kv);
    return;
  }
  drafter_service_ = MakeDrafterService(target_dir, draft_dir);
  auto ds = services::ServiceServer::Start("127.0.0.1", 0, drafter_service_.get(),
                                           v1::Drafter::service_full_name());
  EXPECT_TRUE(ds.ok()) << ds.status();
  drafter_server_ = std::move(*ds);
  drafter_port_ = drafter_server_->port();

  ModelRunnerOptions options;
  options.kv = kv;
  auto runner = ModelRunner::Load(target_dir, options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  target_ = std::make_unique<LocalTargetBackend>(std::move(*runner), engine);
  const ModelConfig& config = target_->target().config();
  auto connection = target::DrafterConnection::Connect(
      "127.0.0.1:" + std::to_string(drafter_port_), std::chrono::seconds(10),
      static_cast<int32_t>(config.vocab_size), static_cast<int32_t>(config.hidden_size), "float32");
  EXPECT_TRUE(connection.ok()) << connection.status();
  for (const v1::DrafterSpec& spec : (*connection)->info().drafters()) {
    EXPECT_TRUE(target_->engine()
                    .AddDrafter(std::make_unique<target::RemoteDrafter>(*connection, spec))
                    .ok());
  }
  target_service_ = std::make_unique<target::TargetService>(target_.get());
  auto ts = services::ServiceServer::Start("127.0.0.1", 0, target_service_.get(),
                                           v1::Target::service_full_name());
  EXPECT_TRUE(ts.ok()) << ts.status();
  target_server_ = std::move(*ts);

  model_.path = target_dir;
  model_.name = std::filesystem::path(target_dir).filename().string();
  auto tok = Tokenizer::FromFile(target_dir + "/tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.status();
  model_.tokenizer = std::move(*tok);
  auto remote = router::RemoteTargetBackend::Connect(
      "127.0.0.1:" + std::to_string(target_server_->port()), std::chrono::seconds(10));
  EXPECT_TRUE(remote.ok()) << remote.status();
  if (remote.ok()) model_.backend = std::move(*remote);
}

ServedStack::~ServedStack() {
  // Servers first (their streams end, the target cancels what a router left), then the target.
  if (target_server_) target_server_->Shutdown();
  if (drafter_server_) drafter_server_->Shutdown();
}

router::ServedModel ServedStack::TakeModel() { return std::move(model_); }

void ServedStack::StopDrafter() {
  if (drafter_server_) drafter_server_->Shutdown(std::chrono::milliseconds(0));
  drafter_server_.reset();
  drafter_service_.reset();
}

void ServedStack::RestartDrafter() {
  drafter_service_ = MakeDrafterService(target_dir_, draft_dir_);
  auto ds = services::ServiceServer::Start("127.0.0.1", drafter_port_, drafter_service_.get(),
                                           v1::Drafter::service_full_name());
  EXPECT_TRUE(ds.ok()) << ds.status();
  if (ds.ok()) drafter_server_ = std::move(*ds);
}

void ServedStack::StopTarget() {
  if (target_server_) target_server_->Shutdown(std::chrono::milliseconds(0));
  target_server_.reset();
}

}  // namespace specula
