// SpecFormer as a Drafter: one forward of the draft block per step drafts l_d future tokens from
// the last position whose target hidden states the drafter has seen.
//
// Position bookkeeping (see common/spec/drafter.h): the target's KV cache holds positions
// 0..P-1 and the pending token sits at position P. Observe feeds the hidden states of exactly the
// positions 0..P-1 (the accepted ones; rejected tree nodes never reach the drafter, so its context
// cache never has to be trimmed) through the hook + context causal attention, appending their keys
// and values to the drafter's own one-layer paged KV cache. The context output at position P-1
// goes through the positional FFN and the draft block: slot j at position t predicts the token at
// t + 2 + j, so at t = P-1 slot 0 predicts position P+1 (the child of the pending token) and slot j
// the node at depth j + 1.
//
// Proposals (per request, budget k = max_nodes, depth <= min(l_d, max_depth)):
//   - chain (tree = false): slot j's argmax for depths 1..min(k, l_d, max_depth). Sampled requests
//     sample slot j's distribution shaped like the target's (temperature, top-k, top-p) and
//     attach it for the lossless rejection verifier.
//   - budgeted tree (tree = true, default; greedy requests): the k nodes with the highest products
//     of slot probabilities along their paths (slot distributions do not depend on the parent, so
//     this is a best-first enumeration over per-depth sorted tokens). With a peaked slot 0 it is
//     the chain; with an uncertain one it spends the budget on siblings instead of depth. Sampled
//     requests get the sampled chain even then: a deterministic candidate is accepted with just
//     the target's probability of it, a sampled one with sum(min(p, q)).
//
// Thread-compatible: one caller at a time (the engine's loop).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/drafters/cached_sequences.h"
#include "common/drafters/draft_vocab.h"
#include "common/drafters/specformer/specformer_config.h"
#include "common/kv/paged_kv_cache.h"
#include "common/model/model_runner.h"
#include "common/spec/drafter.h"

namespace specula {

class SpecFormerCpuForward;
class SpecFormerImpl;

struct SpecFormerDrafterOptions {
  bool tree = true;  // greedy requests: a budgeted tree of k nodes; false: an argmax chain
  // The context attention's cache (one layer, the drafter's kv heads x head_dim per position).
  // num_blocks and memory_mb both 0 (the default): as many blocks of the target's block size as
  // the target's KV cache has, so every sequence the target admits fits (capacity() reports it).
  KvCacheOptions kv{.block_size = 16, .num_blocks = 0, .memory_mb = 0};
  std::string name = "specformer";  // the engine's drafter name
  // The head's tokens (common/drafters/draft_vocab.h); nullptr = the whole vocabulary.
  std::shared_ptr<const DraftVocab> draft_vocab;
  // float32 on the CPU: steps of up to 32 rows run SpecFormerCpuForward (the module's kernels
  // without LibTorch ops; the same results). false: always the module (A/B checks).
  bool cpu_forward = true;
  // Those forwards' products on bfloat16 or int8 copies of the weights where the CPU has them
  // (CpuForward::UseDraftMatmul; --drafter-matmul): cheaper, no longer bitwise the module's.
  DraftMatmul matmul = DraftMatmul::kFloat32;
  // Those forwards' float32 matmuls on packed copies of the weights (CpuForward::
  // UsePackedWeights; --cpu-packed-weights): the same results, one more copy in memory.
  bool packed_weights = true;
};

class SpecFormerDrafter : public Drafter {
 public:
  // Loads a checkpoint directory (config.json + model.safetensors, see SaveSpecFormerDir) for
  // `target`, on the target's device and dtype. Shares (does not copy) the target's final norm and
  // lm_head. Errors: NOT_FOUND (no checkpoint), INVALID_ARGUMENT (not a SpecFormer checkpoint,
  // trained for another target, missing/misshaped tensors, bad options).
  static StatusOr<std::unique_ptr<SpecFormerDrafter>> Load(const std::string& dir,
                                                           const ModelRunner& target,
                                                           SpecFormerDrafterOptions options = {});
  // Wraps an in-memory module (tests, training): moved to the target's device and dtype.
  static StatusOr<std::unique_ptr<SpecFormerDrafter>> Create(std::shared_ptr<SpecFormerImpl> module,
                                                             const ModelRunner& target,
                                                             SpecFormerDrafterOptions options = {});
  ~SpecFormerDrafter() override;

  std::string name() const override { return options_.name; }
  const std::vector<int64_t>& hidden_layers() const override;
  Status AddSequence(SeqId seq, const SamplingParams& sampling) override;
  void ReleaseSequence(SeqId seq) override;
  // INVALID_ARGUMENT when an observation's hidden states are not one [m, d] tensor per hooked
  // layer, or m breaks the invariant (hidden rows seen == tokens seen - 1); RESOURCE_EXHAUSTED
  // when the context cache is full. On error no sequence's state changed.
  Status Observe(const std::vector<DrafterObservation>& observations) override;
  StatusOr<std::vector<CandidateTree>> Propose(const std::vector<DraftRequest>& requests) override;
  // Bytes of the context cache's blocks in use.
  int64_t StateBytes() const override;
  // The cache's blocks and block size.
  DrafterCapacity capacity() const override;

  const SpecFormerConfig& config() const;
  std::shared_ptr<SpecFormerImpl> module() const { return module_; }

  // --- introspection (tests) ---
  std::vector<SeqId> sequences() const;
  // Every token observed for `seq`; the last one is pending. NOT_FOUND for an unknown sequence.
  StatusOr<std::vector<int32_t>> Tokens(SeqId seq) const;
  // The context attention's cached keys and values of `seq`, [T, n_kv, head_dim] each, T = the
  // positions observed. NOT_FOUND for an unknown sequence.
  StatusOr<std::pair<at::Tensor, at::Tensor>> ContextCache(SeqId seq) const;
  // The slot logits [l_d, V] (float32, CPU) Propose would draft `seq` from; FAILED_PRECONDITION
  // before the first hidden state.
  StatusOr<at::Tensor> SlotLogits(SeqId seq);

 private:
  struct State;
  SpecFormerDrafter(std::shared_ptr<SpecFormerImpl> module, std::unique_ptr<PagedKvCache> kv,
                    SpecFormerDrafterOptions options);
  // Logits of the first `slots` slots of each state, [M, slots, V] float32 on the CPU. The
  // head (slots x V x d) runs only over the depths a step drafts, and so does the draft block
  // when its slots are causal; bidirectional slots attend to each other, so all l_d run.
  StatusOr<at::Tensor> DraftLogits(const std::vector<State*>& states, int64_t slots);

  std::shared_ptr<SpecFormerImpl> module_;
  std::shared_ptr<CausalLMImpl> target_module_;  // keeps the shared head alive
  std::unique_ptr<PagedKvCache> kv_;
  std::unique_ptr<SpecFormerCpuForward> cpu_forward_;  // null: the module's forwards only
  SpecFormerDrafterOptions options_;
  CachedSequences<State> states_;
};

}  // namespace specula
