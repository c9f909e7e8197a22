// ParallelSpec as a Drafter: one forward of the k mask rows per step drafts depths 2..k+1, the
// real row of the last committed position drafts depth 1.
//
// Position bookkeeping (see common/spec/drafter.h): the target's KV cache holds positions 0..P-1
// and the pending token x_P sits at P. Observe turns every newly committed position r into the
// real row r = fuse(f_r, e(x_{r+1})) (f = the target's feature at r; without target features
// e(x_{r+1}) alone), runs the decoder layer over the new rows of every sequence in one batched
// forward, appending their keys/values to the drafter's one-layer paged cache (sized with the
// target's blocks), and keeps the output of row P-1, which drafts depth 1 (x_{P+1}). Rejected tree
// nodes never reach the drafter, so the cache holds real rows only and never has to be trimmed.
//
// Propose runs the k' = min(k, depth - 1) mask rows of every sequence in one batched forward:
// mask i of group P-1 sits at cache position P-1+i (written to the sequence's own slots past its
// end for this forward only; the positions are released again before Propose returns), sees the
// real rows 0..P-1 and masks 1..i, and drafts depth i + 1. The per-depth distributions do not
// depend on the parent, so the candidates are built by common/drafters/marginal_drafts.h: a chain
// (argmax, or sampled with the proposal attached), the budgeted best-first tree (default), or a
// static Medusa tree.
//
// Thread-compatible: one caller at a time (the engine's loop).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/drafters/cached_sequences.h"
#include "common/drafters/draft_vocab.h"
#include "common/drafters/marginal_drafts.h"
#include "common/drafters/parallelspec/parallelspec_config.h"
#include "common/kv/paged_kv_cache.h"
#include "common/model/model_runner.h"
#include "common/spec/drafter.h"

namespace specula {

class CpuForward;
class ParallelSpecImpl;

// How the drafts are laid out. kAutoregressive is the paper's baseline on the same network, for
// measuring its central trade-off: no masks; depth i + 1 is drafted from a real-like row that
// fuses depth i's output (the regressed next feature) with depth i's drafted token, as EAGLE
// drafts: one forward per depth instead of one for all, a chain.
// The shape of greedy requests' drafts; sampled requests always get the sampled chain (a tree's
// deterministic candidates are accepted with just the target's probability of each).
enum class ParallelSpecShape { kChain, kMarginalTree, kStaticTree, kAutoregressive };

struct ParallelSpecDrafterOptions {
  ParallelSpecShape shape = ParallelSpecShape::kMarginalTree;
  std::optional<StaticDraftTree> static_tree;  // required for kStaticTree
  // The real rows' cache (one layer, the drafter's kv heads x head_dim per position). num_blocks
  // and memory_mb both 0 (the default): as many blocks of the target's block size as the target's
  // KV cache has, so every sequence the target admits fits (capacity() reports it).
  KvCacheOptions kv{.block_size = 16, .num_blocks = 0, .memory_mb = 0};
  std::string name = "parallelspec";  // the engine's drafter name
  // The head's tokens (common/drafters/draft_vocab.h); nullptr = the whole vocabulary.
  std::shared_ptr<const DraftVocab> draft_vocab;
  // float32 on the CPU: forwards of up to 32 rows run CpuForward's layer and head (the module's
  // kernels without LibTorch ops; the same results). false: always the module (A/B checks).
  bool cpu_forward = true;
  // Those forwards' products on bfloat16 or int8 copies of the weights where the CPU has them
  // (CpuForward::UseDraftMatmul; --drafter-matmul): cheaper, no longer bitwise the module's.
  DraftMatmul matmul = DraftMatmul::kFloat32;
  // Those forwards' float32 matmuls on packed copies of the weights (CpuForward::
  // UsePackedWeights; --cpu-packed-weights): the same results, one more copy in memory.
  bool packed_weights = true;

  // INVALID_ARGUMENT naming the option: a reserved name, a static shape without a tree.
  Status Validate() const;
};

class ParallelSpecDrafter : public Drafter {
 public:
  // Loads a checkpoint directory (config.json + model.safetensors, see SaveParallelSpecDir) for
  // `target`, on the target's device and dtype. Shares (does not copy) the target's embedding and
  // lm_head. Errors: NOT_FOUND (no checkpoint), INVALID_ARGUMENT (not a ParallelSpec checkpoint,
  // trained for another target, missing/misshaped tensors, bad options).
  static StatusOr<std::unique_ptr<ParallelSpecDrafter>> Load(
      const std::string& dir, const ModelRunner& target, ParallelSpecDrafterOptions options = {});
  // Wraps an in-memory module (tests, training): moved to the target's device and dtype.
  static StatusOr<std::unique_ptr<ParallelSpecDrafter>> Create(
      std::shared_ptr<ParallelSpecImpl> module, const ModelRunner& target,
      ParallelSpecDrafterOptions options = {});
  ~ParallelSpecDrafter() override;

  std::string name() const override { return options_.name; }
  // {feature_layer} with target features, {} without.
  const std::vector<int64_t>& hidden_layers() const override;
  Status AddSequence(SeqId seq, const SamplingParams& sampling) override;
  void ReleaseSequence(SeqId seq) override;
  // INVALID_ARGUMENT when an observation's hidden states are not one [m, d] tensor (none without
  // target features), or m breaks the invariant (rows seen == tokens seen - 1);
  // RESOURCE_EXHAUSTED when the cache is full. On error no sequence's state changed.
  Status Observe(const std::vector<DrafterObservation>& observations) override;
  // RESOURCE_EXHAUSTED when the cache has no room for the mask rows of this forward (nothing
  // changed).
  StatusOr<std::vector<CandidateTree>> Propose(const std::vector<DraftRequest>& requests) override;
  // Bytes of the cache's blocks in use.
  int64_t StateBytes() const override;
  // The cache's blocks and block size.
  DrafterCapacity capacity() const override;

  const ParallelSpecConfig& config() const;
  std::shared_ptr<ParallelSpecImpl> module() const { return module_; }

  // --- introspection (tests) ---
  std::vector<SeqId> sequences() const;
  // Every token observed for `seq`; the last one is pending. NOT_FOUND for an unknown sequence.
  StatusOr<std::vector<int32_t>> Tokens(SeqId seq) const;
  // The cached keys (RoPE applied) and values of the real rows of `seq`, [T, n_kv, head_dim]
  // each, T = the positions observed. NOT_FOUND for an unknown sequence.
  StatusOr<std::pair<at::Tensor, at::Tensor>> RealCache(SeqId seq) const;
  // The output [d] of `seq`'s last real row: depth 1's logits come from it, and it regresses the
  // target's feature at the pending position. FAILED_PRECONDITION before one.
  StatusOr<at::Tensor> LastRow(SeqId seq) const;
  // The logits [1 + k, V] (float32, CPU) of depths 1..k+1 Propose drafts `seq` from;
  // FAILED_PRECONDITION before the first committed position.
  StatusOr<at::Tensor> DepthLogitsOf(SeqId seq);

 private:
  struct State;
  // The shape `st`'s next draft takes: options_.shape, or the sampled chain for sampled requests.
  ParallelSpecShape ShapeFor(const State& st) const;
  ParallelSpecDrafter(std::shared_ptr<ParallelSpecImpl> module, std::unique_ptr<PagedKvCache> kv,
                      ParallelSpecDrafterOptions options);
  // Whether a forward of `rows` rows runs CpuForward's layer and head (float32 CPU weights,
  // at most kSmallMatmulMaxRows rows); Rows: at least `floats` of 64-byte-aligned scratch.
  bool CpuForwardApplies(int64_t rows) const;
  float* Rows(int64_t floats);
  // Logits [1 + masks[s], V] (float32, CPU) per state: its depth-1 row and `masks[s]` mask rows in
  // one batched forward.
  StatusOr<std::vector<at::Tensor>> RowLogits(const std::vector<State*>& states,
                                              const std::vector<int64_t>& masks);
  // kAutoregressive: a chain of depths[s] nodes per state, one batched single-row forward per
  // depth; the drafted rows' keys/values sit in the cache only during the call. Sampled proposals
  // are cut to proposal_top_k[s] tokens (0 = dense).
  StatusOr<std::vector<CandidateTree>> DraftAutoregressive(
      const std::vector<State*>& states, const std::vector<int64_t>& depths,
      const std::vector<int32_t>& proposal_top_k);

  std::shared_ptr<ParallelSpecImpl> module_;
  std::vector<int64_t> hidden_layers_;           // the feature layer, when the module reads one
  std::shared_ptr<CausalLMImpl> target_module_;  // keeps the shared weights alive
  at::Tensor mask_inputs_;                       // [k, d] the mask rows' inputs
  std::unique_ptr<PagedKvCache> kv_;
  // float32 CPU only: the layer and head without LibTorch ops, RoPE rows for every position (as
  // RopeFor computes them) and the rows' inputs.
  std::unique_ptr<CpuForward> cpu_forward_;
  at::Tensor rope_cos_, rope_sin_, rows_;
  ParallelSpecDrafterOptions options_;
  CachedSequences<State> states_;
};

}  // namespace specula
