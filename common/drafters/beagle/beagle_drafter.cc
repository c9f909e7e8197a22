#include "common/drafters/beagle/beagle_drafter.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "common/drafters/beagle/beagle_cpu_forward.h"
#include "common/drafters/beagle/beagle_model.h"
#include "common/drafters/beagle/dynamic_tree.h"
#include "common/drafters/draft_sampling.h"
#include "common/drafters/drafter_cache_size.h"
#include "common/drafters/marginal_drafts.h"
#include "common/model/cpu_kernels.h"
#include "common/model/paged_attention.h"
#include "common/model/paged_attention_layout.h"
#include "common/model/transformer.h"

namespace specula {
namespace {

torch::Tensor LongTensor(const std::vector<int64_t>& v, const torch::Device& device) {
  return torch::tensor(v, torch::kLong).to(device);
}

// The best `k` children of a row of head logits `x` [n] (ids[i] the token of entry i; null: i),
// best first (TopTokens: ties to the lower entry), each with its log-softmax of x / temperature
// (the tree's ranking, as the module's log_softmax(logits / temperature)); `scaled` holds n
// floats of scratch.
void BestChildren(const float* x, int64_t n, int64_t k, float temperature, const int64_t* ids,
                  float* scaled, std::vector<DraftChild>* children) {
  const std::vector<int32_t> best =
      TopTokens(std::span<const float>(x, static_cast<size_t>(n)), static_cast<int32_t>(k));
  if (best.empty()) return;
  for (int64_t i = 0; i < n; ++i) scaled[i] = x[i] / temperature;
  const float shift = x[best[0]] / temperature;  // the row's largest
  const float log_sum = shift + std::log(SumExpBelow(scaled, n, shift));
  for (int32_t i : best) {
    children->push_back(
        {static_cast<int32_t>(ids != nullptr ? ids[i] : i), x[i] / temperature - log_sum});
  }
}

}  // namespace

Status BeagleDrafterOptions::Validate() const {
  if (depth <= 0) return InvalidArgumentError(StrCat("Beagle depth must be positive, got ", depth));
  if (top_k <= 0) return InvalidArgumentError(StrCat("Beagle top-k must be positive, got ", top_k));
  if (total_tokens <= 0) {
    return InvalidArgumentError(StrCat("Beagle total tokens must be positive, got ", total_tokens));
  }
  if (!(rank_temperature > 0)) {
    return InvalidArgumentError(
        StrCat("Beagle rank temperature must be positive, got ", rank_temperature));
  }
  if (name.empty() || name == "none") {
    return InvalidArgumentError(StrCat("drafter name '", name, "' is reserved"));
  }
  return OkStatus();
}

struct BeagleDrafter::State {
  State(SeqId id, const SamplingParams& params)
      : kv_seq(id), sampling(params), rng(DraftSeed(params.seed)) {}
  SeqId kv_seq;  // the true-state cache's id for the sequence (process-unique)
  SamplingParams sampling;
  SequenceRng rng;               // sampled chains
  std::vector<int32_t> history;  // tokens observed; the last one is pending (no hidden state)
};

StatusOr<std::unique_ptr<BeagleDrafter>> BeagleDrafter::Load(const std::string& dir,
                                                             const ModelRunner& target,
                                                             BeagleDrafterOptions options) {
  ASSIGN_OR_RETURN(std::shared_ptr<BeagleImpl> module, LoadBeagleDir(dir, target.config()));
  return Create(std::move(module), target, std::move(options));
}

StatusOr<std::unique_ptr<BeagleDrafter>> BeagleDrafter::Create(std::shared_ptr<BeagleImpl> module,
                                                               const ModelRunner& target,
                                                               BeagleDrafterOptions options) {
  if (!module) return InvalidArgumentError("Beagle module is null");
  const BeagleConfig& config = module->config();
  RETURN_IF_ERROR(config.Validate("Beagle config"));
  RETURN_IF_ERROR(config.CheckTarget(target.config()));
  RETURN_IF_ERROR(options.Validate());
  std::shared_ptr<CausalLMImpl> target_module = target.module();
  const torch::Tensor& head = target_module->lm_head_weight();
  std::unique_ptr<PagedKvCache> kv;
  try {
    module->eval();
    module->to(head.device(), head.scalar_type());
    module->SetTargetWeights(target_module->model->embed_tokens->weight, head);
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
    return InternalError(
        StrCat("cannot place Beagle on ", head.device().str(), ": ", e.what_without_backtrace()));
  }
  std::unique_ptr<BeagleCpuForward> cpu_forward;
  if (options.cpu_forward && head.device().is_cpu() && head.scalar_type() == torch::kFloat) {
    try {
      module->mlp->FuseProjections();  // one gate/up matmul (CpuForward::MlpBlock)
      cpu_forward = std::make_unique<BeagleCpuForward>(*module);
      cpu_forward->UseDraftMatmul(options.matmul);
      cpu_forward->UsePackedWeights(options.packed_weights);
    } catch (const c10::Error& e) {
      return InternalError(StrCat("Beagle CPU forward: ", e.what_without_backtrace()));
    }
  }
  auto drafter = std::unique_ptr<BeagleDrafter>(
      new BeagleDrafter(std::move(module), std::move(kv), std::move(options)));
  drafter->target_module_ = std::move(target_module);
  drafter->target_layers_ = target.config().num_hidden_layers;
  drafter->hidden_layers_ = {drafter->target_layers_};
  drafter->cpu_forward_ = std::move(cpu_forward);
  return drafter;
}

BeagleDrafter::BeagleDrafter(std::shared_ptr<BeagleImpl> module, std::unique_ptr<PagedKvCache> kv,
                             BeagleDrafterOptions options)
    : module_(std::move(module)),
      kv_(std::move(kv)),
      options_(std::move(options)),
      states_(&kv_->allocator()) {}

BeagleDrafter::~BeagleDrafter() = default;

const BeagleConfig& BeagleDrafter::config() const { return module_->config(); }

const std::vector<int64_t>& BeagleDrafter::hidden_layers() const { return hidden_layers_; }

int64_t BeagleDrafter::StateBytes() const { return kv_->stats().bytes_in_use(); }

DrafterCapacity BeagleDrafter::capacity() const {
  return {.blocks = kv_->allocator().num_blocks(), .block_size = kv_->allocator().block_size()};
}

DraftMatmul BeagleDrafter::draft_matmul() const {
  return cpu_forward_ ? cpu_forward_->draft_matmul() : DraftMatmul::kFloat32;
}

bool BeagleDrafter::CpuForwardApplies(int64_t last_position) const {
  return cpu_forward_ && last_position < cpu_forward_->max_positions() &&
         cpu_forward_->Applies(*module_) && CpuKernelsApply(kv_->keys(0)) &&
         kv_->keys(0).is_contiguous() && kv_->values(0).is_contiguous();
}

void BeagleDrafter::ObserveOnCpu(const std::vector<DrafterObservation>& observations,
                                 const CachedSequences<State>::Reserved& reserved) {
  at::Tensor& keys = kv_->keys(0);
  for (size_t r = 0; r < reserved.observations.size(); ++r) {
    const at::Tensor& states = observations[reserved.observations[r]].hidden[0];
    std::vector<int64_t> positions(reserved.rows[r]);
    for (int64_t j = 0; j < reserved.rows[r]; ++j) positions[j] = reserved.start[r] + j;
    cpu_forward_->KeysValues(*module_, states.data_ptr<float>(), reserved.rows[r], positions.data(),
                             reserved.slots[r].data(), keys.data_ptr<float>(),
                             kv_->values(0).data_ptr<float>(), keys.size(0));
  }
}

Status BeagleDrafter::AddSequence(SeqId seq, const SamplingParams& sampling) {
  return states_.Add(seq, sampling);
}

void BeagleDrafter::ReleaseSequence(SeqId seq) { states_.Release(seq); }

Status BeagleDrafter::Observe(const std::vector<DrafterObservation>& observations) {
  const int64_t d = config().target.hidden_size, vocab = config().target.vocab_size;

  // Validate everything and reserve the new positions first: on error nothing changes.
  ASSIGN_OR_RETURN(auto reserved,
                   states_.Reserve(observations, vocab, 1, d, "Beagle true-state cache"));
  if (!reserved.observations.empty()) {
    std::vector<int64_t> writes, positions;
    std::vector<torch::Tensor> hidden;
    for (size_t r = 0; r < reserved.observations.size(); ++r) {
      writes.insert(writes.end(), reserved.slots[r].begin(), reserved.slots[r].end());
      for (int64_t j = 0; j < reserved.rows[r]; ++j) positions.push_back(reserved.start[r] + j);
      hidden.push_back(observations[reserved.observations[r]].hidden[0]);
    }
    // The rows as the kernels read them (the target's float32 CPU output is).
    int64_t last = 0;
    bool raw = true;
    for (size_t r = 0; r < reserved.observations.size(); ++r) {
      const at::Tensor& h = observations[reserved.observations[r]].hidden[0];
      raw = raw && CpuKernelsApply(h) && h.is_contiguous();
      last = std::max(last, reserved.start[r] + reserved.rows[r] - 1);
    }
    if (raw && CpuForwardApplies(last)) {
      try {
        ObserveOnCpu(observations, reserved);
      } catch (const c10::Error& e) {
        states_.Unreserve(reserved);
        return InternalError(
            StrCat("Beagle key/value forward failed: ", e.what_without_backtrace()));
      }
      states_.AppendTokens(observations);
      return OkStatus();
    }
    try {
      torch::NoGradGuard no_grad;
      const auto& w = module_->q_proj->weight;
      auto states = torch::cat(hidden, 0).to(w.device(), w.scalar_type());
      auto [k, v] = module_->KeysValues(states, LongTensor(positions, w.device()));
      auto slots = LongTensor(writes, w.device());
      kv_->keys(0).index_copy_(0, slots, k);
      kv_->values(0).index_copy_(0, slots, v);
    } catch (const c10::Error& e) {
      states_.Unreserve(reserved);
      return InternalError(StrCat("Beagle key/value forward failed: ", e.what_without_backtrace()));
    }
  }
  states_.AppendTokens(observations);
  return OkStatus();
}

StatusOr<std::vector<CandidateTree>> BeagleDrafter::Propose(
    const std::vector<DraftRequest>& requests) {
  RETURN_IF_ERROR(CheckDraftRequests(requests, [&](SeqId seq) { return states_.contains(seq); }));
  std::vector<CandidateTree> trees(requests.size());
  const BlockAllocator& alloc = kv_->allocator();
  // Sequences with a budget and at least one true state.
  std::vector<size_t> work;
  std::vector<State*> states;
  std::vector<DynamicTree> builders;
  // Sampled requests draft a sampled chain whatever the mode (EAGLE's sampling): each depth's
  // token drawn from the drafter's distribution shaped like the request's, that distribution
  // attached, so lossless verification accepts it with sum(min(p, q)) rather than a deterministic
  // candidate's p(x). The chain is built in `chains` as it is drawn; the DynamicTree (width 1)
  // still drives the frontier and the paths' drafted states.
  std::vector<uint8_t> sampled;
  std::vector<CandidateTree> chains;
  for (size_t i = 0; i < requests.size(); ++i) {
    State* st = states_.find(requests[i].seq);
    if (requests[i].max_nodes <= 0 || requests[i].max_depth <= 0) continue;
    if (alloc.Length(st->kv_seq) == 0 || st->history.empty()) continue;
    const int32_t depth = std::min(options_.depth, requests[i].max_depth);
    const bool tree = options_.tree && st->sampling.greedy();
    const int32_t budget = tree ? std::min(options_.total_tokens, requests[i].max_nodes)
                                : std::min(depth, requests[i].max_nodes);
    builders.emplace_back(budget, depth, tree ? options_.top_k : 1);
    if (builders.back().done()) {
      builders.pop_back();
      continue;
    }
    work.push_back(i);
    states.push_back(st);
    sampled.push_back(!st->sampling.greedy());
    chains.emplace_back();
  }
  if (work.empty()) return trees;

  int64_t last_position = 0;  // the deepest node's
  for (size_t s = 0; s < work.size(); ++s) {
    last_position = std::max<int64_t>(
        last_position, alloc.Length(states[s]->kv_seq) + builders[s].max_depth() - 1);
  }
  if (CpuForwardApplies(last_position)) {
    try {
      DraftOnCpu(requests, work, states, builders, sampled, chains);
    } catch (const c10::Error& e) {
      return InternalError(StrCat("Beagle draft forward failed: ", e.what_without_backtrace()));
    }
    for (size_t w = 0; w < work.size(); ++w) {
      trees[work[w]] = sampled[w] ? std::move(chains[w]) : builders[w].Build();
    }
    return trees;
  }

  try {
    c10::InferenceMode inference;  // cheaper than NoGradGuard: no autograd or version tracking
    const auto& w = module_->q_proj->weight;
    const torch::Device device = w.device();
    const BeagleConfig& c = config();
    const int64_t M = static_cast<int64_t>(work.size()), H = c.num_attention_heads,
                  Hkv = c.num_key_value_heads, dh = c.head_dim;

    std::vector<int64_t> length(M);
    int64_t T = 0;
    for (int64_t s = 0; s < M; ++s) {
      length[s] = alloc.Length(states[s]->kv_seq);
      T = std::max(T, length[s]);
    }
    // On CPU the queries read the true-state cache where it lies (PagedAttentionCpu, the drafted
    // states of each path as the row's own keys). Elsewhere the true keys/values are gathered
    // once, padded to [M, T, Hkv, dh] (slot 0 fills the padding, masked), for
    // BeagleCrossAttention.
    const bool in_place = PagedKernelSupports(device, w.scalar_type());
    torch::Tensor true_k, true_v, true_len, key_pos;
    if (!in_place) {
      std::vector<int64_t> reads(M * T, 0);
      for (int64_t s = 0; s < M; ++s) {
        std::vector<int64_t> slots = alloc.Slots(states[s]->kv_seq);
        std::copy(slots.begin(), slots.end(), reads.begin() + s * T);
      }
      auto read_index = LongTensor(reads, device);
      true_k = kv_->keys(0).index_select(0, read_index).view({M, T, Hkv, dh});
      true_v = kv_->values(0).index_select(0, read_index).view({M, T, Hkv, dh});
      true_len = LongTensor(length, device).view({M, 1, 1});
      key_pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(device));
    }

    // Drafted states of this call: keys/values of every expanded node's output, appended per
    // depth. node_state[s][c] = its row (candidate c of sequence s); root_state[s] for h_P.
    std::vector<torch::Tensor> drafted_k, drafted_v;
    int64_t drafted_rows = 0;
    std::vector<std::vector<int64_t>> node_state(M);
    std::vector<int64_t> root_state(M, -1);

    for (int32_t depth = 1;; ++depth) {
      int64_t F = 0;
      for (int64_t s = 0; s < M; ++s) {
        F = std::max<int64_t>(F, builders[s].frontier().size());
      }
      if (F == 0) break;
      // Queries: frontier node f of sequence s at row s * F + r; padding rows repeat row 0's
      // token and position and are ignored.
      const int64_t D = options_.concat ? depth - 1 : 0;  // drafted keys per query
      std::vector<int64_t> tokens(M * F), positions(M * F),
          row_state(M * F * std::max<int64_t>(D, 1), 0);
      std::vector<uint8_t> row_valid(M * F * std::max<int64_t>(D, 1), 0);
      for (int64_t s = 0; s < M; ++s) {
        const DynamicTree& tree = builders[s];
        const int64_t P = length[s];  // the pending token's position
        const auto& frontier = tree.frontier();
        for (int64_t r = 0; r < F; ++r) {
          // A finished sequence (empty frontier) pads with its root query.
          const bool pad = r >= static_cast<int64_t>(frontier.size());
          const int32_t f = frontier.empty() ? -1 : frontier[pad ? 0 : r];
          const int64_t row = s * F + r;
          tokens[row] = f < 0 ? states[s]->history.back() : tree.token(f);
          positions[row] = P + (f < 0 ? 0 : tree.depth(f));
          if (D == 0 || pad) continue;
          // The path's drafted states: h_P, then the ancestors of f's parent chain, then f's
          // parent, ..., ending with f's own parent (its output is f's input state).
          std::vector<int64_t> path;
          for (int32_t a = tree.parent(f); a >= 0; a = tree.parent(a))
            path.push_back(node_state[s][a]);
          path.push_back(root_state[s]);
          std::reverse(path.begin(), path.end());
          for (int64_t j = 0; j < D && j < static_cast<int64_t>(path.size()); ++j) {
            row_state[row * D + j] = path[j];
            row_valid[row * D + j] = 1;
          }
        }
      }
      auto pos_t = LongTensor(positions, device);
      auto query = module_->Query(LongTensor(tokens, device), pos_t);
      torch::Tensor row_k, row_v;
      if (D > 0) {
        auto all_k = torch::cat(drafted_k, 0), all_v = torch::cat(drafted_v, 0);
        auto idx = LongTensor(row_state, device);
        row_k = all_k.index_select(0, idx).view({M, F, D, Hkv, dh});
        row_v = all_v.index_select(0, idx).view({M, F, D, Hkv, dh});
      }
      torch::Tensor attn;  // [M, F, H * dh]
      if (in_place) {
        // Query at position P + depth - 1 sees every true key (all are < P).
        PagedAttentionLayout layout(alloc.block_size(), /*sliding_window=*/0);
        for (int64_t s = 0; s < M; ++s) {
          layout.AddReaders(alloc.BlockTable(states[s]->kv_seq), length[s], F);
        }
        std::optional<RowKeys> own;
        if (D > 0) {
          own.emplace();
          own->keys = row_k.view({M * F, D, Hkv, dh});
          own->values = row_v.view({M * F, D, Hkv, dh});
          own->counts.resize(M * F);
          for (int64_t row = 0; row < M * F; ++row) {
            int32_t n = 0;
            while (n < D && row_valid[row * D + n]) ++n;  // a path's states come first
            own->counts[row] = n;
          }
        }
        attn =
            PagedAttentionCpu(query.q, kv_->keys(0), kv_->values(0), layout, own ? &*own : nullptr)
                .view({M, F, H * dh});
      } else {
        auto mask = key_pos.view({1, 1, T}).lt(true_len).expand({M, F, T});
        torch::Tensor row_mask;
        if (D > 0) {
          row_mask = torch::from_blob(row_valid.data(), {M, F, D},
                                      torch::TensorOptions().dtype(torch::kBool))
                         .to(device);
        }
        attn = BeagleCrossAttention(query.q.view({M, F, H, dh}), true_k, true_v, mask, row_k, row_v,
                                    row_mask);
      }
      auto h = module_->Output(query.residual.view({M, F, -1}), attn);  // [M, F, d]
      auto raw_logits = module_->Logits(h).to(torch::kFloat);           // [M, F, V]
      // Tree ranking (greedy requests; sampled ones draw from raw_logits below).
      auto logprobs = torch::log_softmax(raw_logits / options_.rank_temperature, -1);
      // Sampled chains draw from the unscaled logits of their one frontier row (row s * F).
      std::vector<int64_t> sampled_rows;
      for (int64_t s = 0; s < M; ++s) {
        if (sampled[s] && !builders[s].frontier().empty()) sampled_rows.push_back(s * F);
      }
      torch::Tensor sampled_logits;
      if (!sampled_rows.empty()) {
        sampled_logits = raw_logits.view({M * F, -1})
                             .index_select(0, LongTensor(sampled_rows, device))
                             .to(torch::kCPU)
                             .contiguous();
      }
      const int64_t vocab = raw_logits.size(-1);
      const int64_t K = std::min<int64_t>(options_.tree ? options_.top_k : 1, module_->head_size());
      auto top = logprobs.topk(K, -1);
      auto top_lp = std::get<0>(top).to(torch::kCPU).contiguous();
      auto top_tok = std::get<1>(top).to(torch::kCPU).contiguous();
      const float* lp = top_lp.data_ptr<float>();
      const int64_t* tk = top_tok.data_ptr<int64_t>();

      // The outputs' keys/values, for deeper queries on these paths.
      bool more = false;
      for (int64_t s = 0; s < M; ++s) {
        more |=
            !builders[s].frontier().empty() && builders[s].next_depth() < builders[s].max_depth();
      }
      const int64_t base = drafted_rows;
      if (options_.concat && more) {
        auto [k, v] = module_->KeysValues(h.view({M * F, -1}), pos_t);
        drafted_k.push_back(k);
        drafted_v.push_back(v);
        drafted_rows += M * F;
      }
      size_t next_sampled = 0;
      for (int64_t s = 0; s < M; ++s) {
        DynamicTree& tree = builders[s];
        const auto frontier = tree.frontier();
        if (frontier.empty()) continue;
        std::vector<std::vector<DraftChild>> children(frontier.size());
        if (sampled[s]) {
          (frontier[0] < 0 ? root_state[s] : node_state[s][frontier[0]]) = base + s * F;
          CandidateTree& chain = chains[s];
          const std::span<const float> row(
              sampled_logits.data_ptr<float>() + static_cast<int64_t>(next_sampled++) * vocab,
              static_cast<size_t>(vocab));
          const int32_t token = AddChainNode(chain, chain.size() - 1, row, states[s]->sampling,
                                             states[s]->rng, requests[work[s]].proposal_top_k);
          children[0].push_back({token, 0.0f});  // a chain: the score only orders the frontier
          tree.Expand(children);
          node_state[s].resize(tree.num_candidates(), -1);
          continue;
        }
        for (size_t r = 0; r < frontier.size(); ++r) {
          const int64_t row = s * F + static_cast<int64_t>(r);
          if (frontier[r] < 0) {
            root_state[s] = base + row;
          } else {
            node_state[s][frontier[r]] = base + row;
          }
          for (int64_t j = 0; j < K; ++j) {
            children[r].push_back({static_cast<int32_t>(tk[row * K + j]), lp[row * K + j]});
          }
        }
        tree.Expand(children);
        node_state[s].resize(tree.num_candidates(), -1);
      }
    }
  } catch (const c10::Error& e) {
    return InternalError(StrCat("Beagle draft forward failed: ", e.what_without_backtrace()));
  }
  for (size_t w = 0; w < work.size(); ++w) {
    trees[work[w]] = sampled[w] ? std::move(chains[w]) : builders[w].Build();
  }
  return trees;
}

void BeagleDrafter::DraftOnCpu(const std::vector<DraftRequest>& requests,
                               const std::vector<size_t>& work, const std::vector<State*>& states,
                               std::vector<DynamicTree>& builders,
                               const std::vector<uint8_t>& sampled,
                               std::vector<CandidateTree>& chains) {
  const BlockAllocator& alloc = kv_->allocator();
  const BeagleConfig& c = config();
  const int64_t M = static_cast<int64_t>(work.size());
  const int64_t nkv = c.num_key_value_heads * c.head_dim, V = c.target.vocab_size;
  const DraftHead& head = module_->head();
  const int64_t n = module_->head_size();
  const int64_t* ids = head.restricted() ? head.restricted_ids().data_ptr<int64_t>() : nullptr;
  const float* true_k = kv_->keys(0).data_ptr<float>();
  const float* true_v = kv_->values(0).data_ptr<float>();
  std::vector<int64_t> length(M);
  for (int64_t s = 0; s < M; ++s) length[s] = alloc.Length(states[s]->kv_seq);
  // As the module's loop, with rows for the frontier nodes only (no padding): drafted states
  // node_state[s][c] / root_state[s] are rows of drafted_k_ / drafted_v_.
  int64_t drafted_rows = 0;
  std::vector<std::vector<int64_t>> node_state(M);
  std::vector<int64_t> root_state(M, -1);
  std::vector<int64_t> row_start(M + 1), tokens, positions, slots;
  std::vector<int32_t> counts;
  std::vector<float> row_k, row_v, scaled(n), full_row;
  for (int32_t depth = 1;; ++depth) {
    for (int64_t s = 0; s < M; ++s) {
      row_start[s + 1] = row_start[s] + static_cast<int64_t>(builders[s].frontier().size());
    }
    const int64_t R = row_start[M];
    if (R == 0) break;
    const int64_t D = options_.concat ? depth - 1 : 0;  // drafted keys per query
    tokens.resize(R);
    positions.resize(R);
    counts.assign(R, 0);
    row_k.resize(R * D * nkv);
    row_v.resize(R * D * nkv);
    PagedAttentionLayout layout(alloc.block_size(), /*sliding_window=*/0);
    std::vector<int64_t> path;
    for (int64_t s = 0; s < M; ++s) {
      const DynamicTree& tree = builders[s];
      const auto& frontier = tree.frontier();
      // Queries at positions P + depth - 1 see every true key (all are < P).
      if (!frontier.empty()) {
        layout.AddReaders(alloc.BlockTable(states[s]->kv_seq), length[s],
                          static_cast<int64_t>(frontier.size()));
      }
      for (size_t r = 0; r < frontier.size(); ++r) {
        const int32_t f = frontier[r];
        const int64_t row = row_start[s] + static_cast<int64_t>(r);
        tokens[row] = f < 0 ? states[s]->history.back() : tree.token(f);
        positions[row] = length[s] + (f < 0 ? 0 : tree.depth(f));
        if (D == 0) continue;
        // The path's drafted states: h_P, then f's ancestors' outputs down to its parent's.
        path.clear();
        for (int32_t a = tree.parent(f); a >= 0; a = tree.parent(a)) {
          path.push_back(node_state[s][a]);
        }
        path.push_back(root_state[s]);
        std::reverse(path.begin(), path.end());
        const int64_t keys = std::min<int64_t>(D, static_cast<int64_t>(path.size()));
        for (int64_t j = 0; j < keys; ++j) {
          std::memcpy(row_k.data() + (row * D + j) * nkv, drafted_k_.data() + path[j] * nkv,
                      nkv * sizeof(float));
          std::memcpy(row_v.data() + (row * D + j) * nkv, drafted_v_.data() + path[j] * nkv,
                      nkv * sizeof(float));
        }
        counts[row] = static_cast<int32_t>(keys);
      }
    }
    const RowKeysRaw own{
        .keys = row_k.data(), .values = row_v.data(), .row_keys = D, .counts = counts.data()};
    const float* h = cpu_forward_->Draft(*module_, tokens.data(), positions.data(), R, layout,
                                         true_k, true_v, D > 0 ? &own : nullptr);
    const float* scores = cpu_forward_->Scores(*module_, h, R);
    // The outputs' keys and values, for deeper queries on these paths.
    bool more = false;
    for (int64_t s = 0; s < M; ++s) {
      more |= !builders[s].frontier().empty() && builders[s].next_depth() < builders[s].max_depth();
    }
    const int64_t base = drafted_rows;
    if (options_.concat && more) {
      drafted_rows += R;
      if (static_cast<int64_t>(drafted_k_.size()) < drafted_rows * nkv) {
        drafted_k_.resize(drafted_rows * nkv);
        drafted_v_.resize(drafted_rows * nkv);
      }
      slots.resize(R);
      for (int64_t r = 0; r < R; ++r) slots[r] = base + r;
      cpu_forward_->KeysValues(*module_, h, R, positions.data(), slots.data(), drafted_k_.data(),
                               drafted_v_.data(), drafted_rows);
    }
    for (int64_t s = 0; s < M; ++s) {
      DynamicTree& tree = builders[s];
      const std::vector<int32_t> frontier = tree.frontier();
      if (frontier.empty()) continue;
      std::vector<std::vector<DraftChild>> children(frontier.size());
      for (size_t r = 0; r < frontier.size(); ++r) {
        const int64_t row = row_start[s] + static_cast<int64_t>(r);
        (frontier[r] < 0 ? root_state[s] : node_state[s][frontier[r]]) = base + row;
        const float* x = scores + row * n;
        if (sampled[s]) {
          // A sampled chain draws from the unscaled logits over the whole vocabulary.
          full_row.assign(V, -std::numeric_limits<float>::infinity());
          for (int64_t i = 0; i < n; ++i) full_row[ids != nullptr ? ids[i] : i] = x[i];
          CandidateTree& chain = chains[s];
          const int32_t token = AddChainNode(chain, chain.size() - 1, full_row, states[s]->sampling,
                                             states[s]->rng, requests[work[s]].proposal_top_k);
          children[r].push_back({token, 0.0f});  // a chain: the score only orders the frontier
          continue;
        }
        BestChildren(x, n, std::min<int64_t>(tree.top_k(), n), options_.rank_temperature, ids,
                     scaled.data(), &children[r]);
      }
      tree.Expand(children);
      node_state[s].resize(tree.num_candidates(), -1);
    }
  }
}

std::vector<SeqId> BeagleDrafter::sequences() const { return states_.ids(); }

StatusOr<std::vector<int32_t>> BeagleDrafter::Tokens(SeqId seq) const {
  ASSIGN_OR_RETURN(const State* st, states_.Get(seq));
  return st->history;
}

StatusOr<std::pair<at::Tensor, at::Tensor>> BeagleDrafter::TrueCache(SeqId seq) const {
  ASSIGN_OR_RETURN(const State* st, states_.Get(seq));
  return kv_->SequenceKv(0, st->kv_seq);
}

}  // namespace specula
