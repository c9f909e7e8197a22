#include "common/drafters/parallelspec/parallelspec_drafter.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <span>

#include "common/drafters/draft_sampling.h"
#include "common/drafters/drafter_cache_size.h"
#include "common/drafters/parallelspec/parallelspec_model.h"
#include "common/model/cpu_forward.h"
#include "common/model/cpu_kernels.h"
#include "common/model/paged_attention.h"
#include "common/model/transformer.h"

namespace specula {
namespace {

torch::Tensor LongTensor(std::vector<int64_t>& v, const torch::Device& device) {
  return torch::from_blob(v.data(), {static_cast<int64_t>(v.size())},
                          torch::TensorOptions().dtype(torch::kLong))
      .to(device);
}

// Positions appended after each sequence's cached rows for one draft call (mask rows, drafted
// rows), truncated back when this goes out of scope, whether the call succeeded or not.
class ScratchRows {
 public:
  explicit ScratchRows(BlockAllocator& alloc) : alloc_(alloc) {}
  ~ScratchRows() {
    for (const auto& [seq, length] : lengths_) (void)alloc_.Truncate(seq, length);
  }
  ScratchRows(const ScratchRows&) = delete;
  ScratchRows& operator=(const ScratchRows&) = delete;

  // Appends rows[s] positions to seqs[s] (all or none).
  Status Append(const std::vector<SeqId>& seqs, const std::vector<int64_t>& rows,
                const char* what) {
    std::vector<std::pair<SeqId, int64_t>> growth;
    for (size_t s = 0; s < seqs.size(); ++s) {
      lengths_.emplace_back(seqs[s], alloc_.Length(seqs[s]));
      if (rows[s] > 0) growth.emplace_back(seqs[s], rows[s]);
    }
    if (growth.empty()) return OkStatus();
    auto grown = alloc_.AppendAll(growth);
    return grown.ok() ? OkStatus() : grown.status().WithContext(what);
  }
  // Sequence s's length before the call: its first scratch position.
  int64_t length(size_t s) const { return lengths_[s].second; }

 private:
  BlockAllocator& alloc_;
  std::vector<std::pair<SeqId, int64_t>> lengths_;
};

}  // namespace

Status ParallelSpecDrafterOptions::Validate() const {
  if (name.empty() || name == "none") {
    return InvalidArgumentError(StrCat("drafter name '", name, "' is reserved"));
  }
  if (shape == ParallelSpecShape::kStaticTree && !static_tree) {
    return InvalidArgumentError("ParallelSpec static tree shape needs a static tree");
  }
  return OkStatus();
}

struct ParallelSpecDrafter::State {
  State(SeqId id, const SamplingParams& params)
      : kv_seq(id), sampling(params), rng(DraftSeed(params.seed)) {}

  SeqId kv_seq;  // the cache's id for the sequence (process-unique)
  SamplingParams sampling;
  SequenceRng rng;
  std::vector<int32_t> history;  // tokens observed; the last one is pending
  torch::Tensor last;  // [d] output of the last real row (drafts depth 1); undefined before one
};

StatusOr<std::unique_ptr<ParallelSpecDrafter>> ParallelSpecDrafter::Load(
    const std::string& dir, const ModelRunner& target, ParallelSpecDrafterOptions options) {
  ASSIGN_OR_RETURN(std::shared_ptr<ParallelSpecImpl> module,
                   LoadParallelSpecDir(dir, target.config()));
  return Create(std::move(module), target, std::move(options));
}

StatusOr<std::unique_ptr<ParallelSpecDrafter>> ParallelSpecDrafter::Create(
    std::shared_ptr<ParallelSpecImpl> module, const ModelRunner& target,
    ParallelSpecDrafterOptions options) {
  if (!module) return InvalidArgumentError("ParallelSpec module is null");
  const ParallelSpecConfig& config = module->config();
  RETURN_IF_ERROR(config.Validate("ParallelSpec config"));
  RETURN_IF_ERROR(config.CheckTarget(target.config()));
  RETURN_IF_ERROR(options.Validate());
  std::shared_ptr<CausalLMImpl> target_module = target.module();
  const torch::Tensor& head = target_module->lm_head_weight();
  std::unique_ptr<PagedKvCache> kv;
  torch::Tensor mask_inputs;
  try {
    module->eval();
    module->to(head.device(), head.scalar_type());
    module->FuseForServing();
    module->SetTargetWeights(target_module->model->embed_tokens->weight, head);
    if (options.draft_vocab) {
      RETURN_IF_ERROR(options.draft_vocab->Validate("draft vocabulary"));
      RETURN_IF_ERROR(
          options.draft_vocab->CheckTarget(target.config().vocab_size, "draft vocabulary"));
      module->RestrictHead(options.draft_vocab->tokens);
    }
    {
      c10::InferenceMode inference;
      mask_inputs = module->MaskInputs().contiguous();
    }
    ASSIGN_OR_RETURN(
        kv, PagedKvCache::Create(1, config.num_key_value_heads, config.head_dim, head.scalar_type(),
                                 head.device(), SizedFromTarget(options.kv, target.kv_stats())));
  } catch (const c10::Error& e) {
    return InternalError(StrCat("cannot place ParallelSpec on ", head.device().str(), ": ",
                                e.what_without_backtrace()));
  }
  std::unique_ptr<CpuForward> cpu_forward;
  torch::Tensor rope_cos, rope_sin;
  if (options.cpu_forward && head.device().is_cpu() && head.scalar_type() == torch::kFloat) {
    try {
      c10::InferenceMode inference;
      cpu_forward = std::make_unique<CpuForward>(module->layer_config());
      cpu_forward->UseDraftMatmul(options.matmul);
      cpu_forward->UsePackedWeights(options.packed_weights);
      std::tie(rope_cos, rope_sin) = module->RopeFor(
          torch::arange(module->layer_config().max_position_embeddings, torch::kLong));
    } catch (const c10::Error& e) {
      return InternalError(StrCat("ParallelSpec RoPE tables: ", e.what_without_backtrace()));
    }
  }
  auto drafter = std::unique_ptr<ParallelSpecDrafter>(
      new ParallelSpecDrafter(std::move(module), std::move(kv), std::move(options)));
  drafter->target_module_ = std::move(target_module);
  drafter->mask_inputs_ = std::move(mask_inputs);
  drafter->cpu_forward_ = std::move(cpu_forward);
  drafter->rope_cos_ = rope_cos.contiguous();
  drafter->rope_sin_ = rope_sin.contiguous();
  return drafter;
}

ParallelSpecDrafter::ParallelSpecDrafter(std::shared_ptr<ParallelSpecImpl> module,
                                         std::unique_ptr<PagedKvCache> kv,
                                         ParallelSpecDrafterOptions options)
    : module_(std::move(module)),
      kv_(std::move(kv)),
      options_(std::move(options)),
      states_(&kv_->allocator()) {
  if (module_->config().use_target_features) hidden_layers_ = {module_->config().feature_layer};
}

ParallelSpecDrafter::~ParallelSpecDrafter() = default;

namespace {

bool KernelRows(const torch::Tensor& t) { return CpuKernelsApply(t) && t.is_contiguous(); }

}  // namespace

bool ParallelSpecDrafter::CpuForwardApplies(int64_t rows) const {
  if (!cpu_forward_ || rows < 1 || rows > kSmallMatmulMaxRows) return false;
  ParallelSpecImpl& m = *module_;
  const DraftHead& head = m.head();
  const bool fusion_ok = !m.fusion || (KernelRows(m.fusion->weight) && KernelRows(m.fusion->bias) &&
                                       m.fusion->weight.size(1) % 16 == 0);
  return fusion_ok && KernelRows(m.target_embedding()) && KernelRows(mask_inputs_) &&
         KernelRows(head.restricted() ? head.restricted_rows() : head.full_weight()) &&
         KernelRows(rope_cos_) && cpu_forward_->LayerApplies(*m.layer);
}

float* ParallelSpecDrafter::Rows(int64_t floats) {
  if (!rows_.defined() || rows_.numel() < floats) rows_ = at::empty({floats}, at::kFloat);
  return rows_.data_ptr<float>();
}

const ParallelSpecConfig& ParallelSpecDrafter::config() const { return module_->config(); }

const std::vector<int64_t>& ParallelSpecDrafter::hidden_layers() const { return hidden_layers_; }

int64_t ParallelSpecDrafter::StateBytes() const { return kv_->stats().bytes_in_use(); }

DrafterCapacity ParallelSpecDrafter::capacity() const {
  return {.blocks = kv_->allocator().num_blocks(), .block_size = kv_->allocator().block_size()};
}

Status ParallelSpecDrafter::AddSequence(SeqId seq, const SamplingParams& sampling) {
  return states_.Add(seq, sampling);
}

void ParallelSpecDrafter::ReleaseSequence(SeqId seq) { states_.Release(seq); }

Status ParallelSpecDrafter::Observe(const std::vector<DrafterObservation>& observations) {
  const ParallelSpecConfig& c = config();
  const bool features = c.use_target_features;
  // Validate everything and reserve the new positions first: on error nothing changes.
  ASSIGN_OR_RETURN(auto reserved,
                   states_.Reserve(observations, c.target.vocab_size, features ? 1 : 0,
                                   c.target.hidden_size, "ParallelSpec cache"));
  if (!reserved.observations.empty()) {
    const BlockAllocator& alloc = kv_->allocator();
    const int64_t B = static_cast<int64_t>(reserved.observations.size());
    PagedAttentionLayout layout(alloc.block_size(), /*sliding_window=*/0);
    std::vector<int64_t> last_row(B), next_tokens;
    std::vector<torch::Tensor> hidden;
    for (int64_t b = 0; b < B; ++b) {
      const DrafterObservation& o = observations[reserved.observations[b]];
      const std::vector<int32_t>& history = states_.find(o.seq)->history;
      const int64_t seen = static_cast<int64_t>(history.size());
      // Real row r fuses f_r with the token after it, x_{r+1}: always known (the pending token
      // follows the last committed position).
      for (int64_t j = 0; j < reserved.rows[b]; ++j) {
        const int64_t t = reserved.start[b] + j + 1;
        next_tokens.push_back(t < seen ? history[t] : o.tokens[t - seen]);
      }
      if (features) hidden.push_back(o.hidden[0]);
      layout.AddSequence(alloc.BlockTable(reserved.kv_seqs[b]), reserved.start[b],
                         reserved.rows[b]);
      last_row[b] = layout.num_rows() - 1;
    }
    try {
      c10::InferenceMode inference;
      const int64_t N = layout.num_rows();
      bool raw = CpuForwardApplies(N);
      for (const torch::Tensor& h : hidden) raw = raw && KernelRows(h);
      if (raw) {
        // The module's RealInputs and Layer on raw rows (CpuForward): x = fusion([f ; e]) or e.
        ParallelSpecImpl& m = *module_;
        const int64_t d = m.layer_config().hidden_size;
        const float* embedding = m.target_embedding().data_ptr<float>();
        float* x = Rows(N * d * (features ? 3 : 1));
        float* in = x + N * d;  // [N, 2d] with features
        int64_t row = 0;
        for (const torch::Tensor& h : hidden) {
          for (int64_t r = 0; r < h.size(0); ++r) {
            std::memcpy(in + (row + r) * 2 * d, h.data_ptr<float>() + r * d, d * sizeof(float));
          }
          row += h.size(0);
        }
        for (int64_t r = 0; r < N; ++r) {
          float* e = features ? in + r * 2 * d + d : x + r * d;
          std::memcpy(e, embedding + next_tokens[r] * d, d * sizeof(float));
        }
        if (features) {
          cpu_forward_->Matmul(in, N, 2 * d, m.fusion->weight, d, m.fusion->bias.data_ptr<float>(),
                               nullptr, x);
        }
        LayerKvCache layer{kv_->keys(0), kv_->values(0)};
        cpu_forward_->Layer(*m.layer, x, N, layout, rope_cos_.data_ptr<float>(),
                            rope_sin_.data_ptr<float>(), layer);
        for (int64_t b = 0; b < B; ++b) {
          torch::Tensor last = torch::empty({d}, torch::kFloat);
          std::memcpy(last.data_ptr<float>(), x + last_row[b] * d, d * sizeof(float));
          states_.find(observations[reserved.observations[b]].seq)->last = std::move(last);
        }
        states_.AppendTokens(observations);
        return OkStatus();
      }
      const torch::Tensor& w = mask_inputs_;
      torch::Tensor f;
      if (features) f = torch::cat(hidden, 0).to(w.device(), w.scalar_type());
      torch::Tensor x = module_->RealInputs(f, LongTensor(next_tokens, w.device()));
      std::vector<int64_t> positions = layout.positions();
      auto cs = module_->RopeFor(LongTensor(positions, w.device()));
      AttentionInputs in = MakePagedInputs(layout, cs.first, cs.second);
      LayerKvCache layer{kv_->keys(0), kv_->values(0)};
      torch::Tensor h = module_->Layer(x, in, &layer);  // [N, d]
      for (int64_t b = 0; b < B; ++b) {
        states_.find(observations[reserved.observations[b]].seq)->last = h[last_row[b]].clone();
      }
    } catch (const std::exception& e) {
      states_.Unreserve(reserved);
      return InternalError(StrCat("ParallelSpec forward of the committed rows failed: ", e.what()));
    }
  }
  states_.AppendTokens(observations);
  return OkStatus();
}

StatusOr<std::vector<at::Tensor>> ParallelSpecDrafter::RowLogits(
    const std::vector<State*>& states, const std::vector<int64_t>& masks) {
  BlockAllocator& alloc = kv_->allocator();
  const int64_t S = static_cast<int64_t>(states.size());
  // The mask rows take the positions after each sequence's last real row for this forward only.
  std::vector<SeqId> seqs;
  for (State* st : states) seqs.push_back(st->kv_seq);
  ScratchRows scratch(alloc);
  RETURN_IF_ERROR(scratch.Append(seqs, masks, "ParallelSpec mask rows"));
  const bool any_masks = std::any_of(masks.begin(), masks.end(), [](int64_t m) { return m > 0; });
  try {
    c10::InferenceMode inference;
    // The mask rows: a causal chain after each sequence's real rows (mask i sees real rows
    // 0..P-1 and masks 1..i), mask_index[j] the mask input of the j-th.
    PagedAttentionLayout layout(alloc.block_size(), /*sliding_window=*/0);
    std::vector<int64_t> mask_index;
    for (int64_t s = 0; s < S; ++s) {
      if (masks[s] == 0) continue;
      layout.AddSequence(alloc.BlockTable(states[s]->kv_seq), scratch.length(s), masks[s]);
      for (int64_t i = 0; i < masks[s]; ++i) mask_index.push_back(i);
    }
    const int64_t total = S + static_cast<int64_t>(mask_index.size());
    LayerKvCache layer{kv_->keys(0), kv_->values(0)};
    torch::Tensor logits;  // [total, V]: every sequence's depth-1 state, then every mask row
    bool raw = CpuForwardApplies(total);
    for (State* st : states) raw = raw && KernelRows(st->last);
    if (raw) {
      // The same rows through CpuForward's layer and head.
      ParallelSpecImpl& m = *module_;
      const int64_t d = m.layer_config().hidden_size, V = m.layer_config().vocab_size;
      float* x = Rows(total * d);
      for (int64_t s = 0; s < S; ++s) {
        std::memcpy(x + s * d, states[s]->last.data_ptr<float>(), d * sizeof(float));
      }
      for (size_t j = 0; j < mask_index.size(); ++j) {
        std::memcpy(x + (S + static_cast<int64_t>(j)) * d,
                    mask_inputs_.data_ptr<float>() + mask_index[j] * d, d * sizeof(float));
      }
      if (any_masks) {
        cpu_forward_->Layer(*m.layer, x + S * d, total - S, layout, rope_cos_.data_ptr<float>(),
                            rope_sin_.data_ptr<float>(), layer);
      }
      logits = torch::empty({total, V}, torch::kFloat);
      cpu_forward_->Head(m.head(), m.head().full_weight(), x, total, logits.data_ptr<float>());
    } else {
      const torch::Device device = mask_inputs_.device();
      std::vector<torch::Tensor> rows;
      for (State* st : states) rows.push_back(st->last.view({1, -1}));
      if (any_masks) {
        torch::Tensor x = mask_inputs_.index_select(0, LongTensor(mask_index, device));
        std::vector<int64_t> positions = layout.positions();
        auto cs = module_->RopeFor(LongTensor(positions, device));
        AttentionInputs in = MakePagedInputs(layout, cs.first, cs.second);
        rows.push_back(module_->Layer(x, in, &layer));  // [sum masks, d]
      }
      logits = module_->Logits(torch::cat(rows, 0)).to(torch::kFloat).to(torch::kCPU).contiguous();
    }
    std::vector<at::Tensor> out(S);
    int64_t next_mask = S;
    for (int64_t s = 0; s < S; ++s) {
      out[s] = torch::cat({logits.narrow(0, s, 1), logits.narrow(0, next_mask, masks[s])}, 0);
      next_mask += masks[s];
    }
    return out;
  } catch (const std::exception& e) {
    return InternalError(StrCat("ParallelSpec draft forward failed: ", e.what()));
  }
}

StatusOr<std::vector<CandidateTree>> ParallelSpecDrafter::DraftAutoregressive(
    const std::vector<State*>& states, const std::vector<int64_t>& depths,
    const std::vector<int32_t>& proposal_top_k) {
  BlockAllocator& alloc = kv_->allocator();
  const int64_t S = static_cast<int64_t>(states.size());
  std::vector<CandidateTree> trees(S);
  std::vector<int32_t> drafted(S);  // each state's token at the depth just drafted
  // Depth 1 comes from the last real row, as in every shape.
  std::vector<torch::Tensor> last_rows;
  for (State* st : states) last_rows.push_back(st->last.view({1, -1}));
  torch::Tensor h;  // [active, d] outputs of the rows just run
  {
    c10::InferenceMode inference;
    h = torch::cat(last_rows, 0);
  }
  // The drafted rows take the positions after each sequence's real rows for this call only.
  std::vector<SeqId> seqs;
  std::vector<int64_t> drafted_rows;
  for (int64_t s = 0; s < S; ++s) {
    seqs.push_back(states[s]->kv_seq);
    drafted_rows.push_back(depths[s] - 1);
  }
  ScratchRows scratch(alloc);
  RETURN_IF_ERROR(scratch.Append(seqs, drafted_rows, "ParallelSpec drafted rows"));
  try {
    c10::InferenceMode inference;
    const torch::Device device = mask_inputs_.device();
    std::vector<int64_t> active(S);  // states still drafting, rows of h in this order
    for (int64_t s = 0; s < S; ++s) active[s] = s;
    for (int64_t depth = 1; !active.empty(); ++depth) {
      torch::Tensor logits = module_->Logits(h).to(torch::kFloat).to(torch::kCPU).contiguous();
      const int64_t vocab = logits.size(1);
      std::vector<int64_t> next, rows, tokens;
      for (size_t a = 0; a < active.size(); ++a) {
        const int64_t s = active[a];
        State& st = *states[s];
        const std::span<const float> row(logits.data_ptr<float>() + a * vocab,
                                         static_cast<size_t>(vocab));
        drafted[s] = AddChainNode(trees[s], static_cast<int32_t>(depth) - 2, row, st.sampling,
                                  st.rng, proposal_top_k[s]);
        if (depth < depths[s]) {
          next.push_back(s);
          rows.push_back(static_cast<int64_t>(a));
          tokens.push_back(drafted[s]);
        }
      }
      if (next.empty()) break;
      // Depth + 1's row: fuse(this depth's output, this depth's token) at the next free position,
      // attending to the real rows and the drafted rows before it (their keys are in the cache).
      PagedAttentionLayout layout(alloc.block_size(), /*sliding_window=*/0);
      for (int64_t s : next) {
        layout.AddSequence(alloc.BlockTable(states[s]->kv_seq), scratch.length(s) + depth - 1, 1);
      }
      torch::Tensor f = h.index_select(0, LongTensor(rows, h.device()));
      torch::Tensor x = module_->RealInputs(f, LongTensor(tokens, device));
      std::vector<int64_t> positions = layout.positions();
      auto cs = module_->RopeFor(LongTensor(positions, device));
      AttentionInputs in = MakePagedInputs(layout, cs.first, cs.second);
      LayerKvCache layer{kv_->keys(0), kv_->values(0)};
      h = module_->Layer(x, in, &layer);
      active = std::move(next);
    }
    return trees;
  } catch (const std::exception& e) {
    return InternalError(StrCat("ParallelSpec autoregressive draft failed: ", e.what()));
  }
}

ParallelSpecShape ParallelSpecDrafter::ShapeFor(const State& st) const {
  // Trees for greedy requests only: a sampled request accepts a deterministic candidate with
  // just the target's probability of it, a sampled draft with sum(min(p, q)) (held-out a at
  // T = 1, k = 2: 1.12 as a marginal tree, 1.50 as a chain; docs/BENCHMARKS.md). The
  // autoregressive baseline keeps its own shape (it samples each depth itself).
  if (st.sampling.greedy() || options_.shape == ParallelSpecShape::kAutoregressive) {
    return options_.shape;
  }
  return ParallelSpecShape::kChain;
}

StatusOr<std::vector<CandidateTree>> ParallelSpecDrafter::Propose(
    const std::vector<DraftRequest>& requests) {
  RETURN_IF_ERROR(CheckDraftRequests(requests, [&](SeqId seq) { return states_.contains(seq); }));
  std::vector<CandidateTree> trees(requests.size());
  const int64_t k = config().num_mask_tokens;
  std::vector<size_t> work;
  std::vector<State*> states;
  std::vector<int64_t> masks;
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    State* st = states_.find(r.seq);
    // No budget, or nothing committed yet: an empty tree.
    if (r.max_nodes <= 0 || r.max_depth <= 0 || !st->last.defined()) continue;
    // No tree is deeper than its node budget; a static tree no deeper than its paths. The
    // autoregressive baseline drafts as deep as the parallel shapes (k + 1), to compare them at
    // equal depth.
    int64_t depth = std::min<int64_t>({k + 1, r.max_depth, r.max_nodes});
    if (ShapeFor(*st) == ParallelSpecShape::kStaticTree) {
      depth = std::min<int64_t>(depth, options_.static_tree->max_depth());
    }
    work.push_back(i);
    states.push_back(st);
    masks.push_back(depth - 1);
  }
  if (work.empty()) return trees;
  if (options_.shape == ParallelSpecShape::kAutoregressive) {
    std::vector<int64_t> depths;
    std::vector<int32_t> top_k;
    for (int64_t m : masks) depths.push_back(m + 1);
    for (size_t i : work) top_k.push_back(requests[i].proposal_top_k);
    ASSIGN_OR_RETURN(std::vector<CandidateTree> chains, DraftAutoregressive(states, depths, top_k));
    for (size_t w = 0; w < work.size(); ++w) trees[work[w]] = std::move(chains[w]);
    return trees;
  }
  ASSIGN_OR_RETURN(std::vector<at::Tensor> logits, RowLogits(states, masks));
  for (size_t w = 0; w < work.size(); ++w) {
    const DraftRequest& r = requests[work[w]];
    State& st = *states[w];
    const DepthLogits rows{logits[w].data_ptr<float>(), logits[w].size(1)};
    const int32_t depth = static_cast<int32_t>(logits[w].size(0));
    switch (ShapeFor(st)) {
      case ParallelSpecShape::kChain:
        trees[work[w]] = DraftMarginalChain(rows, depth, st.sampling, st.rng, r.proposal_top_k);
        break;
      case ParallelSpecShape::kMarginalTree:
        trees[work[w]] = DraftMarginalTree(rows, depth, r.max_nodes, st.sampling);
        break;
      case ParallelSpecShape::kStaticTree:
        trees[work[w]] = options_.static_tree->Draft(rows, depth, r.max_nodes, st.sampling);
        break;
      case ParallelSpecShape::kAutoregressive:
        break;  // drafted above
    }
  }
  return trees;
}

std::vector<SeqId> ParallelSpecDrafter::sequences() const { return states_.ids(); }

StatusOr<std::vector<int32_t>> ParallelSpecDrafter::Tokens(SeqId seq) const {
  ASSIGN_OR_RETURN(const State* st, states_.Get(seq));
  return st->history;
}

StatusOr<std::pair<at::Tensor, at::Tensor>> ParallelSpecDrafter::RealCache(SeqId seq) const {
  ASSIGN_OR_RETURN(const State* st, states_.Get(seq));
  return kv_->SequenceKv(0, st->kv_seq);
}

StatusOr<at::Tensor> ParallelSpecDrafter::LastRow(SeqId seq) const {
  ASSIGN_OR_RETURN(const State* st, states_.Get(seq));
  if (!st->last.defined()) {
    return FailedPreconditionError(StrCat("sequence ", seq, " has no committed position yet"));
  }
  return st->last;
}

StatusOr<at::Tensor> ParallelSpecDrafter::DepthLogitsOf(SeqId seq) {
  ASSIGN_OR_RETURN(State * st, states_.Get(seq));
  if (!st->last.defined()) {
    return FailedPreconditionError(StrCat("sequence ", seq, " has no committed position yet"));
  }
  ASSIGN_OR_RETURN(std::vector<at::Tensor> logits, RowLogits({st}, {config().num_mask_tokens}));
  return logits[0];
}

}  // namespace specula
