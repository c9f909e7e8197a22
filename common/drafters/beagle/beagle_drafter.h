// Beagle as a Drafter: autoregressive cross-attention drafting of an EAGLE-2 dynamic tree.
//
// Position bookkeeping (see common/spec/drafter.h): the target's KV cache holds positions 0..P-1
// and the pending token sits at P. Observe turns the target's top hidden states (layer L, after
// the final norm) of exactly those committed positions into keys/values of the drafter's
// true-state cache, a one-layer paged KV cache per sequence. Rejected tree nodes never reach the
// drafter, so the cache never has to be trimmed.
//
// Propose, one depth at a time for every sequence of the batch together:
//   depth 1: the query e(pending token) at position P attends to the true keys 0..P-1; its output
//            h_P gives the root's children (log-softmax of lm_head(h_P), over temperature for
//            sampled requests).
//   depth d: each frontier node (token at P+d-1) attends to the true keys plus, with `concat` (the
//            paper's "concate", default on), the drafted states of its own path: h_P and its
//            ancestors' outputs, as keys at their positions. Without `concat` only true keys.
// The drafted states live only inside one Propose (a per-call buffer), so the cache holds true
// states only at the end of every round, as the paper prescribes. The tree is EAGLE-2's dynamic
// tree (dynamic_tree.h) with depth, top-k and size min(total_tokens, the step's budget); the chain
// is the same loop with top-k 1 (argmax per depth). Candidates are deterministic, so both are
// lossless for sampled requests too (point masses in the verifier).
//
// Thread-compatible: one caller at a time (the engine's loop).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/drafters/beagle/beagle_config.h"
#include "common/drafters/cached_sequences.h"
#include "common/drafters/draft_vocab.h"
#include "common/kv/paged_kv_cache.h"
#include "common/model/model_runner.h"
#include "common/spec/drafter.h"

namespace specula {

class BeagleCpuForward;
class BeagleImpl;
class DynamicTree;

struct BeagleDrafterOptions {
  bool tree = true;           // EAGLE-2 dynamic tree; false: a chain (argmax per depth)
  int32_t depth = 7;          // deepest drafted node: EAGLE-2's "1+6" (the root expansion + 6)
  int32_t top_k = 10;         // children per expanded node and frontier width
  int32_t total_tokens = 60;  // tree size cap (also capped by each step's budget)
  bool concat = true;         // drafted states as keys for deeper drafts ("concate")
  // Divides the drafter's logits before ranking nodes (on top of a sampled request's own
  // temperature): < 1 sharpens the path probabilities, so a small budget goes deeper instead of to
  // siblings. Candidates stay deterministic, so any value is lossless. 1 = EAGLE-2 as published;
  // 0.5 measured better at every budget on the bundled model (docs/BENCHMARKS.md: a 2.64 vs 2.16
  // at 4 nodes, 3.36 vs 2.82 at 16).
  float rank_temperature = 0.5f;
  // The true-state cache (one layer, the drafter's kv heads x head_dim per position).
  // num_blocks and memory_mb both 0 (the default): as many blocks of the target's block size as
  // the target's KV cache has, so every sequence the target admits fits (capacity() reports it).
  KvCacheOptions kv{.block_size = 16, .num_blocks = 0, .memory_mb = 0};
  std::string name = "beagle";  // the engine's drafter name
  // The head's tokens (common/drafters/draft_vocab.h); nullptr = the whole vocabulary.
  std::shared_ptr<const DraftVocab> draft_vocab;
  // float32 on the CPU: Observe and Propose run BeagleCpuForward (the module's computation
  // without LibTorch ops, the same values within float rounding). false: always the module.
  bool cpu_forward = true;
  // Those forwards' products on bfloat16 or int8 copies of the weights where the CPU has them
  // (CpuForward::UseDraftMatmul; --drafter-matmul).
  DraftMatmul matmul = DraftMatmul::kFloat32;
  // Their float32 matmuls on packed copies of the weights (CpuForward::UsePackedWeights).
  bool packed_weights = true;

  // INVALID_ARGUMENT naming the option when a size is not positive or the name is reserved.
  Status Validate() const;
};

class BeagleDrafter : public Drafter {
 public:
  // Loads a checkpoint directory (config.json + model.safetensors, see SaveBeagleDir) for
  // `target`, on the target's device and dtype. Shares (does not copy) the target's embedding and
  // lm_head. Errors: NOT_FOUND (no checkpoint), INVALID_ARGUMENT (not a Beagle checkpoint, trained
  // for another target, missing/misshaped tensors, bad options).
  static StatusOr<std::unique_ptr<BeagleDrafter>> Load(const std::string& dir,
                                                       const ModelRunner& target,
                                                       BeagleDrafterOptions options = {});
  // Wraps an in-memory module (tests, training): moved to the target's device and dtype.
  static StatusOr<std::unique_ptr<BeagleDrafter>> Create(std::shared_ptr<BeagleImpl> module,
                                                         const ModelRunner& target,
                                                         BeagleDrafterOptions options = {});
  ~BeagleDrafter() override;

  std::string name() const override { return options_.name; }
  const std::vector<int64_t>& hidden_layers() const override;
  Status AddSequence(SeqId seq, const SamplingParams& sampling) override;
  void ReleaseSequence(SeqId seq) override;
  // INVALID_ARGUMENT when an observation's hidden states are not one [m, d] tensor, or m breaks
  // the invariant (hidden rows seen == tokens seen - 1); RESOURCE_EXHAUSTED when the true-state
  // cache is full. On error no sequence's state changed.
  Status Observe(const std::vector<DrafterObservation>& observations) override;
  StatusOr<std::vector<CandidateTree>> Propose(const std::vector<DraftRequest>& requests) override;
  // Bytes of the true-state cache's blocks in use.
  int64_t StateBytes() const override;
  // The cache's blocks and block size.
  DrafterCapacity capacity() const override;
  // The products the CPU forward runs (kFloat32 without one: the module).
  DraftMatmul draft_matmul() const;

  const BeagleConfig& config() const;
  const BeagleDrafterOptions& options() const { return options_; }
  std::shared_ptr<BeagleImpl> module() const { return module_; }

  // --- introspection (tests) ---
  std::vector<SeqId> sequences() const;
  // Every token observed for `seq`; the last one is pending. NOT_FOUND for an unknown sequence.
  StatusOr<std::vector<int32_t>> Tokens(SeqId seq) const;
  // The true-state cache of `seq`: keys (RoPE applied) and values [T, n_kv, head_dim], T = the
  // positions observed. NOT_FOUND for an unknown sequence.
  StatusOr<std::pair<at::Tensor, at::Tensor>> TrueCache(SeqId seq) const;

 private:
  struct State;
  BeagleDrafter(std::shared_ptr<BeagleImpl> module, std::unique_ptr<PagedKvCache> kv,
                BeagleDrafterOptions options);
  // Whether cpu_forward_ takes this call: it exists and applies to the module now, and the
  // deepest position drafted (`last_position`) has a RoPE row.
  bool CpuForwardApplies(int64_t last_position) const;
  // Observe's keys and values of the reserved rows on cpu_forward_.
  void ObserveOnCpu(const std::vector<DrafterObservation>& observations,
                    const CachedSequences<State>::Reserved& reserved);
  // Propose's depths on cpu_forward_ for the sequences `states` (requests[work[s]]): expands
  // `builders` (and draws sampled requests' `chains`) as the module's loop does.
  void DraftOnCpu(const std::vector<DraftRequest>& requests, const std::vector<size_t>& work,
                  const std::vector<State*>& states, std::vector<DynamicTree>& builders,
                  const std::vector<uint8_t>& sampled, std::vector<CandidateTree>& chains);

  std::shared_ptr<BeagleImpl> module_;
  std::shared_ptr<CausalLMImpl> target_module_;  // keeps the shared weights alive
  int64_t target_layers_ = 0;
  std::vector<int64_t> hidden_layers_;  // {target_layers_}: the final-normed states
  std::unique_ptr<PagedKvCache> kv_;
  BeagleDrafterOptions options_;
  CachedSequences<State> states_;
  std::unique_ptr<BeagleCpuForward> cpu_forward_;  // null: the module always
  // DraftOnCpu's drafted states' keys and values, kept between calls.
  std::vector<float> drafted_k_, drafted_v_;
};

}  // namespace specula
