// The conformance suite with each drafter behind a Drafter service on 127.0.0.1, reached through
// RemoteDrafter over one gRPC stream, as the target sees a drafter of the three-process
// deployment: hidden states, trees and errors cross the wire.
#include <gtest/gtest.h>

#include <chrono>

#include "services/common/service_server.h"
#include "services/drafter/drafter_service.h"
#include "services/target/remote_drafter.h"
#include "tests/drafters/drafter_conformance.h"

namespace specula {
namespace {

// A RemoteDrafter that owns the service and server behind it.
class ServedDrafter : public Drafter {
 public:
  ServedDrafter(std::unique_ptr<drafter::DrafterService> service,
                std::unique_ptr<services::ServiceServer> server,
                std::unique_ptr<target::RemoteDrafter> remote)
      : service_(std::move(service)), server_(std::move(server)), remote_(std::move(remote)) {}
  ~ServedDrafter() override {
    remote_.reset();  // the client's stream ends before the server stops
    server_.reset();
  }

  std::string name() const override { return remote_->name(); }
  const std::vector<int64_t>& hidden_layers() const override { return remote_->hidden_layers(); }
  Status AddSequence(SeqId seq, const SamplingParams& sampling) override {
    return remote_->AddSequence(seq, sampling);
  }
  void ReleaseSequence(SeqId seq) override { remote_->ReleaseSequence(seq); }
  Status Observe(const std::vector<DrafterObservation>& observations) override {
    return remote_->Observe(observations);
  }
  StatusOr<std::vector<CandidateTree>> Propose(const std::vector<DraftRequest>& requests) override {
    return remote_->Propose(requests);
  }
  StatusOr<std::vector<CandidateTree>> ObserveAndPropose(
      const std::vector<DrafterObservation>& observations,
      const std::vector<DraftRequest>& requests, Status* observed) override {
    return remote_->ObserveAndPropose(observations, requests, observed);
  }
  DrafterCapacity capacity() const override { return remote_->capacity(); }

 private:
  std::unique_ptr<drafter::DrafterService> service_;
  std::unique_ptr<services::ServiceServer> server_;
  std::unique_ptr<target::RemoteDrafter> remote_;
};

// The service's proposal cut-off: below the suite's vocabulary of 8, so sampled proposals cross the
// wire sparse, as with the default of 64 on a real vocabulary.
constexpr int32_t kProposalTopK = 3;

class RemoteProvider : public DrafterProvider {
 public:
  bool remote() const override { return true; }
  int32_t proposal_top_k() const override { return kProposalTopK; }
  std::unique_ptr<Drafter> Provide(std::unique_ptr<Drafter> drafter,
                                   const ModelRunner& target) override {
    const ModelConfig& c = target.config();
    std::vector<std::unique_ptr<Drafter>> drafters;
    drafters.push_back(std::move(drafter));
    auto service = std::make_unique<drafter::DrafterService>(
        std::move(drafters),
        drafter::DrafterServiceOptions{.vocab_size = static_cast<int32_t>(c.vocab_size),
                                       .hidden_size = static_cast<int32_t>(c.hidden_size),
                                       .dtype = "float32",
                                       .context_length = c.max_position_embeddings,
                                       .proposal_top_k = kProposalTopK});
    auto server = services::ServiceServer::Start("127.0.0.1", 0, service.get(),
                                                 v1::Drafter::service_full_name());
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return nullptr;
    auto connection = target::DrafterConnection::Connect(
        "127.0.0.1:" + std::to_string((*server)->port()), std::chrono::seconds(10),
        static_cast<int32_t>(c.vocab_size), static_cast<int32_t>(c.hidden_size), "float32");
    EXPECT_TRUE(connection.ok()) << connection.status();
    if (!connection.ok()) return nullptr;
    // Generous: a loaded 2-core machine must not turn a slow call into a draft error here (the
    // deadline has its own tests).
    (*connection)->set_call_deadline(std::chrono::seconds(120));
    auto remote =
        std::make_unique<target::RemoteDrafter>(*connection, (*connection)->info().drafters(0));
    return std::make_unique<ServedDrafter>(std::move(service), std::move(*server),
                                           std::move(remote));
  }
};

}  // namespace

std::unique_ptr<DrafterProvider> MakeConformanceProvider() {
  return std::make_unique<RemoteProvider>();
}

}  // namespace specula
