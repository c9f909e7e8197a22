#include "common/drafters/specdec/specdec_drafter.h"

#include <torch/torch.h>

#include <algorithm>
#include <span>

#include "common/drafters/draft_sampling.h"
#include "common/drafters/marginal_drafts.h"
#include "common/drafters/specdec/specdec_model.h"
#include "common/model/paged_attention.h"

namespace specula {

struct SpecDecDrafter::State {
  State(SeqId id, const SamplingParams& params)
      : kv_seq(id), sampling(params), rng(DraftSeed(params.seed)) {}

  SeqId kv_seq;  // the cache's id for the sequence (process-unique)
  SamplingParams sampling;
  SequenceRng rng;
  std::vector<int32_t> history;  // tokens observed (= cached, position = index)
};

namespace {

// Int64 CPU tensor of `v` (owning a copy).
torch::Tensor LongTensor(const std::vector<int64_t>& v) {
  return torch::tensor(v, torch::TensorOptions().dtype(torch::kLong));
}

}  // namespace

StatusOr<std::unique_ptr<SpecDecDrafter>> SpecDecDrafter::Load(const std::string& dir,
                                                               const ModelConfig& target,
                                                               SpecDecDrafterOptions options) {
  ASSIGN_OR_RETURN(std::shared_ptr<SpecDecImpl> module, LoadSpecDecDir(dir, target));
  return Create(std::move(module), std::move(options));
}

StatusOr<std::unique_ptr<SpecDecDrafter>> SpecDecDrafter::Create(
    std::shared_ptr<SpecDecImpl> module, SpecDecDrafterOptions options) {
  if (!module) return InvalidArgumentError("SpecDec module is null");
  const SpecDecConfig& config = module->config();
  RETURN_IF_ERROR(config.Validate("SpecDec config"));
  if (options.name.empty() || options.name == "none") {
    return InvalidArgumentError(StrCat("drafter name '", options.name, "' is reserved"));
  }
  bool dtype_ok = false;
  const torch::ScalarType dtype = ParseTorchDtype(options.dtype, &dtype_ok);
  if (!dtype_ok) {
    return InvalidArgumentError(
        StrCat("SpecDec dtype: unknown '", options.dtype, "' (float32, bfloat16, float16)"));
  }
  std::unique_ptr<PagedKvCache> kv;
  try {
    const torch::Device device(options.device);
    module->eval();
    module->to(device, dtype);
    module->FuseForServing();
    ASSIGN_OR_RETURN(kv, PagedKvCache::Create(config.encoder_layers + config.decoder_layers,
                                              config.geometry.num_key_value_heads,
                                              config.geometry.head_dim, dtype, device, options.kv));
  } catch (const c10::Error& e) {
    return InvalidArgumentError(StrCat("cannot place SpecDec on device '", options.device,
                                       "': ", e.what_without_backtrace()));
  }
  return std::unique_ptr<SpecDecDrafter>(
      new SpecDecDrafter(std::move(module), std::move(kv), std::move(options)));
}

SpecDecDrafter::SpecDecDrafter(std::shared_ptr<SpecDecImpl> module,
                               std::unique_ptr<PagedKvCache> kv, SpecDecDrafterOptions options)
    : module_(std::move(module)),
      kv_(std::move(kv)),
      options_(std::move(options)),
      states_(&kv_->allocator()) {}

SpecDecDrafter::~SpecDecDrafter() = default;

const SpecDecConfig& SpecDecDrafter::config() const { return module_->config(); }

Status SpecDecDrafter::AddSequence(SeqId seq, const SamplingParams& sampling) {
  return states_.Add(seq, sampling);
}

void SpecDecDrafter::ReleaseSequence(SeqId seq) { states_.Release(seq); }

// One batched encoder step over every sequence's new tokens: the encoder layers write their
// keys/values, then each decoder layer's cross keys/values of the new states are written at the
// same slots.
Status SpecDecDrafter::Observe(const std::vector<DrafterObservation>& observations) {
  const SpecDecConfig& config = module_->config();
  const int64_t vocab = config.target.vocab_size;
  // Validate everything first: on error nothing changes.
  for (size_t i = 0; i < observations.size(); ++i) {
    const DrafterObservation& o = observations[i];
    if (!states_.contains(o.seq))
      return NotFoundError(StrCat("sequence ", o.seq, " was not added"));
    for (size_t j = 0; j < i; ++j) {
      if (observations[j].seq == o.seq) {
        return InvalidArgumentError(StrCat("sequence ", o.seq, " is observed twice in one call"));
      }
    }
    for (size_t t = 0; t < o.tokens.size(); ++t) {
      if (o.tokens[t] < 0 || o.tokens[t] >= vocab) {
        return InvalidArgumentError(StrCat("sequence ", o.seq, ": tokens[", t, "] = ", o.tokens[t],
                                           " is outside the vocabulary [0, ", vocab, ")"));
      }
    }
  }
  BlockAllocator& alloc = kv_->allocator();
  std::vector<std::pair<SeqId, int64_t>> growth;
  std::vector<const DrafterObservation*> members;
  std::vector<int64_t> start;
  for (const DrafterObservation& o : observations) {
    if (o.tokens.empty()) continue;
    const SeqId kv_seq = states_.find(o.seq)->kv_seq;
    members.push_back(&o);
    start.push_back(alloc.Length(kv_seq));
    growth.emplace_back(kv_seq, static_cast<int64_t>(o.tokens.size()));
  }
  if (members.empty()) return OkStatus();
  auto slots = alloc.AppendAll(growth);
  if (!slots.ok()) return slots.status().WithContext("SpecDec cache");

  try {
    c10::InferenceMode inference;
    PagedAttentionLayout layout(alloc.block_size(), /*sliding_window=*/0);
    std::vector<int64_t> tokens;
    for (size_t b = 0; b < members.size(); ++b) {
      layout.AddSequence(alloc.BlockTable(growth[b].first), start[b], growth[b].second);
      tokens.insert(tokens.end(), members[b]->tokens.begin(), members[b]->tokens.end());
    }
    const auto [cos, sin] = module_->RopeFor(LongTensor(layout.positions()));
    const AttentionInputs in = MakePagedInputs(layout, cos, sin);
    std::vector<LayerKvCache> encoder_kv;
    for (int64_t l = 0; l < config.encoder_layers; ++l) {
      encoder_kv.push_back({kv_->keys(l), kv_->values(l)});
    }
    const torch::Tensor states =
        module_->Encode(LongTensor(tokens).to(cos.device()), in, &encoder_kv);  // [N, d]
    const torch::Tensor write = LongTensor(layout.write_slots()).to(cos.device());
    for (int64_t l = 0; l < config.decoder_layers; ++l) {
      auto [k, v] = module_->CrossKeyValues(l, states, cos, sin);
      kv_->keys(config.encoder_layers + l).index_copy_(0, write, k);
      kv_->values(config.encoder_layers + l).index_copy_(0, write, v);
    }
  } catch (const std::exception& e) {
    for (size_t b = 0; b < members.size(); ++b) (void)alloc.Truncate(growth[b].first, start[b]);
    return InternalError(StrCat("SpecDec encoder forward failed: ", e.what()));
  }
  for (const DrafterObservation* o : members) {
    auto& history = states_.find(o->seq)->history;
    history.insert(history.end(), o->tokens.begin(), o->tokens.end());
  }
  return OkStatus();
}

StatusOr<at::Tensor> SpecDecDrafter::DraftLogits(const std::vector<State*>& states) {
  const SpecDecConfig& config = module_->config();
  const int64_t k = config.num_slots, M = static_cast<int64_t>(states.size());
  BlockAllocator& alloc = kv_->allocator();
  // The slots take positions n..n+k-1 for this forward only.
  std::vector<std::pair<SeqId, int64_t>> growth;
  std::vector<int64_t> length;
  for (State* st : states) {
    growth.emplace_back(st->kv_seq, k);
    length.push_back(alloc.Length(st->kv_seq));
  }
  auto slots = alloc.AppendAll(growth);
  if (!slots.ok()) return slots.status().WithContext("SpecDec cache (draft slots)");
  StatusOr<at::Tensor> logits = InternalError("SpecDec draft forward did not run");
  try {
    c10::InferenceMode inference;
    PagedAttentionLayout layout(alloc.block_size(), /*sliding_window=*/0);
    for (int64_t b = 0; b < M; ++b) {
      layout.AddBidirectionalBlock(alloc.BlockTable(growth[b].first), length[b], k);
    }
    const auto [cos, sin] = module_->RopeFor(LongTensor(layout.positions()));
    const AttentionInputs in = MakePagedInputs(layout, cos, sin);
    std::vector<LayerKvCache> decoder_kv;
    for (int64_t l = 0; l < config.decoder_layers; ++l) {
      decoder_kv.push_back(
          {kv_->keys(config.encoder_layers + l), kv_->values(config.encoder_layers + l)});
    }
    const torch::Tensor slot = torch::arange(k, torch::kLong).repeat({M});
    const torch::Tensor x = module_->SlotInputs(slot, torch::full({M * k}, -1, torch::kLong));
    logits = module_->DecodePaged(x, in, &decoder_kv)
                 .to(torch::kFloat)
                 .to(torch::kCPU)
                 .contiguous()
                 .view({M, k, -1});
  } catch (const std::exception& e) {
    logits = InternalError(StrCat("SpecDec draft forward failed: ", e.what()));
  }
  for (int64_t b = 0; b < M; ++b) (void)alloc.Truncate(growth[b].first, length[b]);
  return logits;
}

StatusOr<std::vector<CandidateTree>> SpecDecDrafter::Propose(
    const std::vector<DraftRequest>& requests) {
  RETURN_IF_ERROR(CheckDraftRequests(requests, [&](SeqId seq) { return states_.contains(seq); }));
  std::vector<CandidateTree> trees(requests.size());
  std::vector<size_t> work;
  std::vector<State*> states;
  for (size_t i = 0; i < requests.size(); ++i) {
    State* st = states_.find(requests[i].seq);
    // No budget, or nothing observed yet: an empty tree.
    if (requests[i].max_nodes <= 0 || requests[i].max_depth <= 0 || st->history.empty()) continue;
    work.push_back(i);
    states.push_back(st);
  }
  if (work.empty()) return trees;
  ASSIGN_OR_RETURN(at::Tensor logits, DraftLogits(states));  // [M, k, V]
  const int64_t k = logits.size(1), vocab = logits.size(2);
  for (size_t w = 0; w < work.size(); ++w) {
    const DraftRequest& r = requests[work[w]];
    State& st = *states[w];
    const DepthLogits rows{logits.data_ptr<float>() + static_cast<int64_t>(w) * k * vocab, vocab};
    const int64_t depth = std::min<int64_t>({k, r.max_nodes, r.max_depth});
    trees[work[w]] = DraftMarginalChain(rows, static_cast<int32_t>(depth), st.sampling, st.rng,
                                        r.proposal_top_k);
  }
  return trees;
}

int64_t SpecDecDrafter::StateBytes() const { return kv_->stats().bytes_in_use(); }

StatusOr<std::vector<int32_t>> SpecDecDrafter::Tokens(SeqId seq) const {
  ASSIGN_OR_RETURN(const State* st, states_.Get(seq));
  return st->history;
}

StatusOr<std::pair<at::Tensor, at::Tensor>> SpecDecDrafter::CacheOf(SeqId seq,
                                                                    int64_t layer) const {
  ASSIGN_OR_RETURN(const State* st, states_.Get(seq));
  const SpecDecConfig& config = module_->config();
  if (layer < 0 || layer >= config.encoder_layers + config.decoder_layers) {
    return InvalidArgumentError(StrCat("cache layer ", layer, " outside [0, ",
                                       config.encoder_layers + config.decoder_layers, ")"));
  }
  return kv_->SequenceKv(layer, st->kv_seq);
}

StatusOr<at::Tensor> SpecDecDrafter::SlotLogits(SeqId seq) {
  ASSIGN_OR_RETURN(State * st, states_.Get(seq));
  if (st->history.empty()) {
    return FailedPreconditionError(StrCat("sequence ", seq, " has no observed token yet"));
  }
  ASSIGN_OR_RETURN(at::Tensor logits, DraftLogits({st}));
  return logits[0];
}

}  // namespace specula
