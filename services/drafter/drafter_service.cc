#include "services/drafter/drafter_service.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <utility>

#include "common/spec/spec_engine.h"
#include "services/common/engine_codec.h"
#include "services/common/grpc_status.h"
#include "services/common/tensor_codec.h"

namespace specula::drafter {

// One target's sequences: its ids -> this process's, per drafter.
struct DrafterService::SessionState {
  struct Seq {
    SeqId id = 0;
    bool observed = false;  // the first observation is the prompt's (one hidden row fewer)
    int64_t tokens = 0;     // observed so far (the target's sequence length)
  };
  std::map<std::pair<std::string, int64_t>, Seq> seqs;
};

DrafterService::DrafterService(std::vector<std::unique_ptr<Drafter>> drafters,
                               DrafterServiceOptions options, DrafterMetrics* metrics)
    : options_(std::move(options)), metrics_(metrics) {
  for (auto& d : drafters) {
    const std::string name = d->name();
    drafters_[name] = std::move(d);
  }
}

DrafterService::~DrafterService() = default;

std::vector<std::string> DrafterService::drafter_names() const {
  std::vector<std::string> names;
  for (const auto& [name, d] : drafters_) names.push_back(name);
  return names;
}

int32_t DrafterService::num_sequences() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_sequences_;
}

grpc::Status DrafterService::GetDrafterInfo(grpc::ServerContext*, const v1::GetDrafterInfoRequest*,
                                            v1::DrafterInfo* response) {
  for (const auto& [name, d] : drafters_) {
    v1::DrafterSpec* spec = response->add_drafters();
    spec->set_name(name);
    for (int64_t l : d->hidden_layers()) spec->add_hidden_layers(l);
    const DrafterCapacity capacity = d->capacity();
    if (capacity.bounded()) {
      spec->set_cache_blocks(capacity.blocks);
      spec->set_cache_block_size(capacity.block_size);
    }
  }
  response->set_vocab_size(options_.vocab_size);
  response->set_hidden_size(options_.hidden_size);
  response->set_hidden_dtype(services::DTypeFromName(options_.dtype));
  return grpc::Status::OK;
}

grpc::Status DrafterService::Session(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::DrafterReply, v1::DrafterCall>* stream) {
  SessionState session;
  v1::DrafterCall call;
  while (stream->Read(&call)) {
    const auto start = std::chrono::steady_clock::now();
    v1::DrafterReply reply;
    Status status = HandleGuarded(session, call, &reply);
    if (!status.ok()) {
      reply.Clear();
      reply.set_code(static_cast<int32_t>(status.code()));
      reply.set_message(status.message());
    }
    if (metrics_) {
      static const char* const kCalls[] = {"none", "", "add", "release", "observe", "propose"};
      const int kind = static_cast<int>(call.call_case());
      metrics_->Call(
          call.drafter(), kind >= 2 && kind <= 5 ? kCalls[kind] : "none",
          std::string(StatusCodeName(status.code())),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      metrics_->SetSequences(num_sequences());
    }
    if (!stream->Write(reply)) break;
  }
  EndSession(session);
  if (metrics_) metrics_->SetSequences(num_sequences());
  return grpc::Status::OK;
}

void DrafterService::EndSession(SessionState& session) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, seq] : session.seqs) {
    drafters_.at(key.first)->ReleaseSequence(seq.id);
    --num_sequences_;
  }
  session.seqs.clear();
}

Status DrafterService::HandleGuarded(SessionState& session, const v1::DrafterCall& call,
                                     v1::DrafterReply* reply) {
  // A drafter's LibTorch error or allocation failure costs this call only (the target drops the
  // sequences' drafts); escaping into gRPC it would end the session and every sequence in it.
  try {
    return Handle(session, call, reply);
  } catch (const c10::Error& e) {
    return InternalError(StrCat("drafter '", call.drafter(), "': ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return InternalError(StrCat("drafter '", call.drafter(), "': ", e.what()));
  }
}

Status DrafterService::Handle(SessionState& session, const v1::DrafterCall& call,
                              v1::DrafterReply* reply) {
  auto it = drafters_.find(call.drafter());
  if (it == drafters_.end()) {
    std::string known;
    for (const auto& [name, d] : drafters_) known += (known.empty() ? "" : ", ") + name;
    return InvalidArgumentError(
        StrCat("drafter: unknown drafter '", call.drafter(), "' (loaded: ", known, ")"));
  }
  Drafter& drafter = *it->second;
  const std::string& name = it->first;
  std::lock_guard<std::mutex> lock(mu_);

  switch (call.call_case()) {
    case v1::DrafterCall::kAdd: {
      const auto key = std::make_pair(name, call.add().seq());
      if (session.seqs.count(key)) {
        return AlreadyExistsError(StrCat("add.seq: sequence ", key.second, " already exists"));
      }
      const SamplingParams sampling = services::FromProto(call.add().sampling());
      Status valid = sampling.Validate();
      if (!valid.ok()) return Status(valid.code(), "add.sampling." + valid.message());
      const SeqId id = NewSequenceId();
      RETURN_IF_ERROR(drafter.AddSequence(id, sampling));
      session.seqs[key] = {.id = id};
      ++num_sequences_;
      return OkStatus();
    }
    case v1::DrafterCall::kRelease: {
      auto seq = session.seqs.find({name, call.release().seq()});
      if (seq != session.seqs.end()) {
        drafter.ReleaseSequence(seq->second.id);
        session.seqs.erase(seq);
        --num_sequences_;
      }
      return OkStatus();
    }
    case v1::DrafterCall::kObserve: {
      // Everything is checked before the drafter sees any of it.
      const std::vector<int64_t> layers = drafter.hidden_layers();
      const v1::DType dtype = services::DTypeFromName(options_.dtype);
      std::vector<DrafterObservation> observations;
      std::vector<SessionState::Seq*> seqs;
      const auto& obs = call.observe().observations();
      for (int i = 0; i < obs.size(); ++i) {
        const v1::Observation& o = obs[i];
        const std::string field = StrCat("observe.observations[", i, "]");
        auto seq = session.seqs.find({name, o.seq()});
        if (seq == session.seqs.end()) {
          return NotFoundError(StrCat(field, ".seq: unknown sequence ", o.seq()));
        }
        if (o.tokens().empty()) return InvalidArgumentError(StrCat(field, ".tokens is empty"));
        for (int t = 0; t < o.tokens_size(); ++t) {
          if (o.tokens(t) < 0 || o.tokens(t) >= options_.vocab_size) {
            return InvalidArgumentError(StrCat(field, ".tokens[", t, "] = ", o.tokens(t),
                                               " is outside the vocabulary [0, ",
                                               options_.vocab_size, ")"));
          }
        }
        if (o.hidden_size() != static_cast<int>(layers.size())) {
          return InvalidArgumentError(StrCat(field, ".hidden: drafter '", name, "' needs ",
                                             layers.size(), " hidden-state tensors, got ",
                                             o.hidden_size()));
        }
        const int64_t length = seq->second.tokens + o.tokens_size();
        if (options_.context_length > 0 && length > options_.context_length) {
          return InvalidArgumentError(
              StrCat(field, ".tokens: ", o.tokens_size(), " tokens take sequence ", o.seq(), " to ",
                     length, " tokens, past the context length of ", options_.context_length));
        }
        const int64_t rows = o.tokens_size() - (seq->second.observed ? 0 : 1);
        DrafterObservation observation{.seq = seq->second.id};
        observation.tokens.assign(o.tokens().begin(), o.tokens().end());
        for (int l = 0; l < o.hidden_size(); ++l) {
          ASSIGN_OR_RETURN(at::Tensor h,
                           services::DecodeTensor(o.hidden(l), StrCat(field, ".hidden[", l, "]"),
                                                  dtype, {rows, options_.hidden_size}));
          observation.hidden.push_back(std::move(h));
        }
        observations.push_back(std::move(observation));
        seqs.push_back(&seq->second);
      }
      RETURN_IF_ERROR(drafter.Observe(observations));
      for (size_t i = 0; i < seqs.size(); ++i) {
        seqs[i]->observed = true;
        seqs[i]->tokens += static_cast<int64_t>(observations[i].tokens.size());
      }
      return OkStatus();
    }
    case v1::DrafterCall::kPropose: {
      std::vector<DraftRequest> requests;
      const auto& reqs = call.propose().requests();
      for (int i = 0; i < reqs.size(); ++i) {
        const v1::DraftRequest& r = reqs[i];
        const std::string field = StrCat("propose.requests[", i, "]");
        auto seq = session.seqs.find({name, r.seq()});
        if (seq == session.seqs.end()) {
          return NotFoundError(StrCat(field, ".seq: unknown sequence ", r.seq()));
        }
        if (r.max_nodes() < 0 || r.max_nodes() > kMaxDraftTokens) {
          return InvalidArgumentError(StrCat(field, ".max_nodes must be in [0, ", kMaxDraftTokens,
                                             "], got ", r.max_nodes()));
        }
        if (r.max_depth() < 0 || r.max_depth() > kMaxDraftTokens) {
          return InvalidArgumentError(StrCat(field, ".max_depth must be in [0, ", kMaxDraftTokens,
                                             "], got ", r.max_depth()));
        }
        if (!(r.min_reach() >= 0 && r.min_reach() <= 1)) {  // NaN fails too
          return InvalidArgumentError(
              StrCat(field, ".min_reach must be in [0, 1], got ", r.min_reach()));
        }
        if (!(r.depth_reach() >= 0 && std::isfinite(r.depth_reach()))) {
          return InvalidArgumentError(
              StrCat(field, ".depth_reach must be finite and at least 0, got ", r.depth_reach()));
        }
        requests.push_back({.seq = seq->second.id,
                            .max_nodes = r.max_nodes(),
                            .max_depth = r.max_depth(),
                            .proposal_top_k = options_.proposal_top_k,
                            .min_reach = r.min_reach(),
                            .depth_reach = r.depth_reach()});
      }
      ASSIGN_OR_RETURN(std::vector<CandidateTree> trees, drafter.Propose(requests));
      for (const CandidateTree& tree : trees) {
        RETURN_IF_ERROR(services::ToProto(tree, reply->add_trees()));
      }
      return OkStatus();
    }
    default:
      return InvalidArgumentError("call: one of add, release, observe or propose must be set");
  }
}

}  // namespace specula::drafter
