#include "common/drafters/specformer/specformer_drafter.h"

#include <torch/torch.h>

#include <algorithm>
#include <optional>

#include "common/drafters/draft_sampling.h"
#include "common/drafters/drafter_cache_size.h"
#include "common/drafters/marginal_drafts.h"
#include "common/drafters/specformer/specformer_cpu_forward.h"
#include "common/drafters/specformer/specformer_model.h"
#include "common/model/cpu_kernels.h"
#include "common/model/paged_attention.h"
#include "common/model/transformer.h"

namespace specula {
struct SpecFormerDrafter::State {
  State(SeqId id, const SamplingParams& params)
      : kv_seq(id), sampling(params), rng(DraftSeed(params.seed)) {}

  SeqId kv_seq;  // the context cache's id for the sequence (process-unique)
  SamplingParams sampling;
  SequenceRng rng;
  std::vector<int32_t> history;  // tokens observed; the last one is pending (no hidden state)
  torch::Tensor last;  // [d] context output at the last observed position; undefined before one
};

StatusOr<std::unique_ptr<SpecFormerDrafter>> SpecFormerDrafter::Load(
    const std::string& dir, const ModelRunner& target, SpecFormerDrafterOptions options) {
  ASSIGN_OR_RETURN(std::shared_ptr<SpecFormerImpl> module, LoadSpecFormerDir(dir, target.config()));
  return Create(std::move(module), target, std::move(options));
}

StatusOr<std::unique_ptr<SpecFormerDrafter>> SpecFormerDrafter::Create(
    std::shared_ptr<SpecFormerImpl> module, const ModelRunner& target,
    SpecFormerDrafterOptions options) {
  if (!module) return InvalidArgumentError("SpecFormer module is null");
  const SpecFormerConfig& config = module->config();
  RETURN_IF_ERROR(config.Validate("SpecFormer config"));
  RETURN_IF_ERROR(config.CheckTarget(target.config()));
  if (options.name.empty() || options.name == "none") {
    return InvalidArgumentError(StrCat("drafter name '", options.name, "' is reserved"));
  }
  std::shared_ptr<CausalLMImpl> target_module = target.module();
  const torch::Tensor& head = target_module->lm_head_weight();
  std::unique_ptr<PagedKvCache> kv;
  try {
    module->eval();
    module->to(head.device(), head.scalar_type());
    module->FuseForServing();
    module->SetTargetWeights(target_module->model->embed_tokens->weight,
                             target_module->model->norm->weight, head,
                             target.config().rms_norm_eps);
    if (options.draft_vocab) {
      RETURN_IF_ERROR(options.draft_vocab->Validate("draft vocabulary"));
      RETURN_IF_ERROR(
          options.draft_vocab->CheckTarget(target.config().vocab_size, "draft vocabulary"));
      module->RestrictHead(options.draft_vocab->tokens);
    }
    ASSIGN_OR_RETURN(
        kv, PagedKvCache::Create(1, config.num_key_value_heads, config.head_dim, head.scalar_type(),
                                 head.device(), SizedFromTarget(options.kv, target.kv_stats())));
  } catch (const c10::Error& e) {
    return InternalError(StrCat("cannot place SpecFormer on ", head.device().str(), ": ",
                                e.what_without_backtrace()));
  }
  std::unique_ptr<SpecFormerCpuForward> cpu_forward;
  if (options.cpu_forward && head.device().is_cpu() && head.scalar_type() == torch::kFloat) {
    try {
      cpu_forward = std::make_unique<SpecFormerCpuForward>(*module);
      cpu_forward->UseDraftMatmul(options.matmul);
      cpu_forward->UsePackedWeights(options.packed_weights);
    } catch (const c10::Error& e) {
      return InternalError(StrCat("SpecFormer RoPE tables: ", e.what_without_backtrace()));
    }
  }
  auto drafter = std::unique_ptr<SpecFormerDrafter>(
      new SpecFormerDrafter(std::move(module), std::move(kv), std::move(options)));
  drafter->target_module_ = std::move(target_module);
  drafter->cpu_forward_ = std::move(cpu_forward);
  return drafter;
}

SpecFormerDrafter::SpecFormerDrafter(std::shared_ptr<SpecFormerImpl> module,
                                     std::unique_ptr<PagedKvCache> kv,
                                     SpecFormerDrafterOptions options)
    : module_(std::move(module)),
      kv_(std::move(kv)),
      options_(std::move(options)),
      states_(&kv_->allocator()) {}

SpecFormerDrafter::~SpecFormerDrafter() = default;

const SpecFormerConfig& SpecFormerDrafter::config() const { return module_->config(); }

const std::vector<int64_t>& SpecFormerDrafter::hidden_layers() const {
  return module_->config().hidden_layers;
}

Status SpecFormerDrafter::AddSequence(SeqId seq, const SamplingParams& sampling) {
  return states_.Add(seq, sampling);
}

void SpecFormerDrafter::ReleaseSequence(SeqId seq) { states_.Release(seq); }

Status SpecFormerDrafter::Observe(const std::vector<DrafterObservation>& observations) {
  const SpecFormerConfig& config = module_->config();
  const size_t K = config.hidden_layers.size();
  const int64_t d = config.target_hidden_size;
  const BlockAllocator& alloc = kv_->allocator();

  // Validate everything and reserve the new positions first: on error nothing changes.
  ASSIGN_OR_RETURN(auto reserved, states_.Reserve(observations, config.target_vocab_size, K, d,
                                                  "SpecFormer context cache"));
  const std::vector<size_t>& with_rows = reserved.observations;
  if (!with_rows.empty()) {
    // The new rows attend causally to their own sequence's cache in place (the same layout and
    // kernel as the target's attention).
    const int64_t B = static_cast<int64_t>(with_rows.size());
    const std::vector<int64_t>& old_len = reserved.start;
    PagedAttentionLayout layout(alloc.block_size(), /*sliding_window=*/0);
    std::vector<int64_t> last_row(B), next_tokens;
    for (int64_t b = 0; b < B; ++b) {
      layout.AddSequence(alloc.BlockTable(reserved.kv_seqs[b]), old_len[b], reserved.rows[b]);
      last_row[b] = layout.num_rows() - 1;
      if (!config.pending_token) continue;
      // Row r's next token x_{r+1} is always known: the last new row's is the pending token.
      const DrafterObservation& o = observations[with_rows[b]];
      const std::vector<int32_t>& history = states_.find(o.seq)->history;
      const int64_t seen = static_cast<int64_t>(history.size());
      for (int64_t j = 0; j < reserved.rows[b]; ++j) {
        const int64_t t = old_len[b] + j + 1;
        next_tokens.push_back(t < seen ? history[t] : o.tokens[t - seen]);
      }
    }

    try {
      c10::InferenceMode inference;
      LayerKvCache layer{kv_->keys(0), kv_->values(0)};
      // The rows' states as the kernels read them (the target's float32 CPU output is).
      bool raw_states = cpu_forward_ && cpu_forward_->Applies(*module_, layout.num_rows());
      for (size_t i = 0; raw_states && i < with_rows.size(); ++i) {
        for (const at::Tensor& h : observations[with_rows[i]].hidden) {
          raw_states = raw_states && CpuKernelsApply(h) && h.is_contiguous();
        }
      }
      if (raw_states) {
        std::vector<std::vector<at::Tensor>> hidden;
        for (size_t i : with_rows) hidden.push_back(observations[i].hidden);
        const at::Tensor c = cpu_forward_->Context(*module_, hidden, next_tokens, layout, layer);
        for (int64_t b = 0; b < B; ++b) {
          states_.find(observations[with_rows[b]].seq)->last = c[last_row[b]].clone();
        }
        states_.AppendTokens(observations);
        return OkStatus();
      }
      const auto& w = module_->downsampler->weight;
      std::vector<torch::Tensor> hidden(K);
      for (size_t k = 0; k < K; ++k) {
        std::vector<torch::Tensor> parts;
        for (size_t i : with_rows) parts.push_back(observations[i].hidden[k]);
        hidden[k] = torch::cat(parts, 0).to(w.device(), w.scalar_type());
      }
      std::vector<int64_t> positions = layout.positions();
      auto cs = module_->RopeFor(torch::from_blob(positions.data(),
                                                  {static_cast<int64_t>(positions.size())},
                                                  torch::TensorOptions().dtype(torch::kLong)));
      AttentionInputs in = MakePagedInputs(layout, cs.first, cs.second);
      torch::Tensor next;
      if (config.pending_token) {
        next = torch::tensor(next_tokens, torch::TensorOptions().dtype(torch::kLong));
      }
      torch::Tensor c = module_->Context(module_->Hook(hidden, next), in, &layer);  // [N, d]
      for (int64_t b = 0; b < B; ++b) {
        states_.find(observations[with_rows[b]].seq)->last = c[last_row[b]].clone();
      }
    } catch (const std::exception& e) {
      states_.Unreserve(reserved);
      return InternalError(StrCat("SpecFormer context forward failed: ", e.what()));
    }
  }
  states_.AppendTokens(observations);
  return OkStatus();
}

StatusOr<at::Tensor> SpecFormerDrafter::DraftLogits(const std::vector<State*>& states,
                                                    int64_t slots) {
  try {
    c10::InferenceMode inference;
    const int64_t n = std::min<int64_t>(slots, module_->config().draft_len);
    const int64_t runs = module_->config().causal_draft ? n : module_->config().draft_len;
    if (cpu_forward_ &&
        cpu_forward_->Applies(*module_, static_cast<int64_t>(states.size()) * runs)) {
      std::vector<const float*> c;
      bool raw = true;
      for (State* st : states) {
        raw = raw && CpuKernelsApply(st->last) && st->last.is_contiguous();
        if (raw) c.push_back(st->last.data_ptr<float>());
      }
      if (raw) return cpu_forward_->DraftLogits(*module_, c, slots);
    }
    std::vector<torch::Tensor> rows;
    for (State* st : states) rows.push_back(st->last);
    torch::Tensor c = torch::stack(rows, 0);                  // [M, d]
    torch::Tensor s = module_->Slots(c, slots).contiguous();  // [M, slots, d]
    return module_->Logits(s).to(torch::kFloat).to(torch::kCPU).contiguous();
  } catch (const c10::Error& e) {
    return InternalError(StrCat("SpecFormer draft forward failed: ", e.what_without_backtrace()));
  }
}

StatusOr<std::vector<CandidateTree>> SpecFormerDrafter::Propose(
    const std::vector<DraftRequest>& requests) {
  RETURN_IF_ERROR(CheckDraftRequests(requests, [&](SeqId seq) { return states_.contains(seq); }));
  std::vector<CandidateTree> trees(requests.size());
  std::vector<size_t> work;
  std::vector<State*> states;
  for (size_t i = 0; i < requests.size(); ++i) {
    State* st = states_.find(requests[i].seq);
    // No budget, or nothing observed yet: an empty tree.
    if (requests[i].max_nodes <= 0 || requests[i].max_depth <= 0 || !st->last.defined()) continue;
    work.push_back(i);
    states.push_back(st);
  }
  if (work.empty()) return trees;
  int64_t deepest = 0;
  for (size_t i : work) deepest = std::max<int64_t>(deepest, requests[i].max_depth);
  ASSIGN_OR_RETURN(at::Tensor logits,
                   DraftLogits(states, std::min<int64_t>(deepest, module_->config().draft_len)));
  const int64_t l = logits.size(1), vocab = logits.size(2);
  for (size_t w = 0; w < work.size(); ++w) {
    const DraftRequest& r = requests[work[w]];
    State& st = *states[w];
    const DepthLogits slots{logits.data_ptr<float>() + static_cast<int64_t>(w) * l * vocab, vocab};
    const int32_t depth = static_cast<int32_t>(std::min<int64_t>(l, r.max_depth));
    // Trees for greedy requests only: a sampled request accepts a deterministic candidate with
    // just the target's probability of it, a sampled draft with sum(min(p, q)) (held-out a at
    // T = 1, k = 2: 1.20 as a tree, 1.40 as a chain; docs/BENCHMARKS.md).
    const bool tree = options_.tree && st.sampling.greedy();
    trees[work[w]] = tree ? DraftMarginalTree(slots, depth, r.max_nodes, st.sampling)
                          : DraftMarginalChain(slots, std::min(depth, r.max_nodes), st.sampling,
                                               st.rng, r.proposal_top_k);
  }
  return trees;
}

int64_t SpecFormerDrafter::StateBytes() const { return kv_->stats().bytes_in_use(); }

DrafterCapacity SpecFormerDrafter::capacity() const {
  return {.blocks = kv_->allocator().num_blocks(), .block_size = kv_->allocator().block_size()};
}

std::vector<SeqId> SpecFormerDrafter::sequences() const { return states_.ids(); }

StatusOr<std::vector<int32_t>> SpecFormerDrafter::Tokens(SeqId seq) const {
  ASSIGN_OR_RETURN(const State* st, states_.Get(seq));
  return st->history;
}

StatusOr<std::pair<at::Tensor, at::Tensor>> SpecFormerDrafter::ContextCache(SeqId seq) const {
  ASSIGN_OR_RETURN(const State* st, states_.Get(seq));
  return kv_->SequenceKv(0, st->kv_seq);
}

StatusOr<at::Tensor> SpecFormerDrafter::SlotLogits(SeqId seq) {
  ASSIGN_OR_RETURN(State * st, states_.Get(seq));
  if (!st->last.defined()) {
    return FailedPreconditionError(StrCat("sequence ", seq, " has no observed hidden state yet"));
  }
  ASSIGN_OR_RETURN(at::Tensor logits, DraftLogits({st}, module_->config().draft_len));
  return logits[0];
}

}  // namespace specula
