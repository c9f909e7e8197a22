// The Drafter service (proto/specula/v1/drafter.proto): drafter models and their per-sequence
// state, driven by a target over one bidirectional stream per target. Every call is validated
// before it reaches a drafter (unknown drafter or sequence, tokens outside the vocabulary, hidden
// states of the wrong dtype, shape or size, a tree budget over kMaxDraftTokens, a sequence observed
// past the context length: INVALID_ARGUMENT / NOT_FOUND naming the field) and answered with its
// error; the session and every other sequence go on.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/spec/drafter.h"
#include "services/drafter/drafter_metrics.h"
#include "specula/v1/drafter.grpc.pb.h"

namespace specula::drafter {

// The cut-off for the proposal distributions of sampled candidates sent over the wire: each is
// cut to its top k tokens before the drafter samples (DraftRequest::proposal_top_k,
// common/spec/proposal.h), so a sampled node costs O(k) bytes instead of O(vocab).
inline constexpr int32_t kDefaultProposalTopK = 64;

struct DrafterServiceOptions {
  int32_t vocab_size = 0;         // the target's
  int32_t hidden_size = 0;        // the target's
  std::string dtype = "float32";  // the target's hidden-state dtype
  int64_t context_length = 0;     // the target's; 0 = unchecked
  // DraftRequest::proposal_top_k of every Propose this service runs (0 = dense proposals).
  int32_t proposal_top_k = kDefaultProposalTopK;
};

class DrafterService final : public v1::Drafter::Service {
 public:
  // `metrics` (may be null) must outlive the service.
  DrafterService(std::vector<std::unique_ptr<Drafter>> drafters, DrafterServiceOptions options,
                 DrafterMetrics* metrics = nullptr);
  ~DrafterService() override;

  grpc::Status GetDrafterInfo(grpc::ServerContext* context,
                              const v1::GetDrafterInfoRequest* request,
                              v1::DrafterInfo* response) override;
  grpc::Status Session(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::DrafterReply, v1::DrafterCall>* stream) override;

  std::vector<std::string> drafter_names() const;
  int32_t num_sequences() const;  // across sessions (tests)

 private:
  struct SessionState;
  Status Handle(SessionState& session, const v1::DrafterCall& call, v1::DrafterReply* reply);
  // Handle with exceptions turned into INTERNAL naming the drafter.
  Status HandleGuarded(SessionState& session, const v1::DrafterCall& call, v1::DrafterReply* reply);
  void EndSession(SessionState& session);

  DrafterServiceOptions options_;
  DrafterMetrics* metrics_;
  mutable std::mutex mu_;  // drafters are single-threaded; sessions take turns per call
  std::map<std::string, std::unique_ptr<Drafter>> drafters_;
  int32_t num_sequences_ = 0;
};

}  // namespace specula::drafter
