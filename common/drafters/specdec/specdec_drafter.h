// The SpecDec Spec-Drafter as a Drafter: one batched encoder step over each sequence's new
// committed tokens (Observe), one batched decoder pass over k query slots (Propose).
//
// Token-only: it needs no hidden states of the target, so it runs in the drafter process of a
// split deployment with only tokens on the wire, like the draft model.
//
// Cache (one paged cache, L_e + L_d layers, one block table per sequence): layers 0..L_e-1 hold the
// encoder's keys/values, layers L_e.. the decoder layers' cross keys/values of the encoder states.
// Observe appends every committed token (the pending one included: it is the target's own token)
// at position = index, so the cache is never trimmed. Propose appends the k slots at positions
// n..n+k-1 for one forward (each slot sees the whole prefix and every slot) and truncates them
// again, so only committed tokens stay.
//
// Proposals: a chain of min(k, max_nodes, max_depth) nodes, slot j's argmax (greedy requests) or a
// draw from slot j's distribution shaped like the target's with that distribution attached for
// the lossless rejection verifier (sampled requests). All k slots always run (the model was
// trained with k bidirectional slots); deeper ones are dropped.
//
// Thread-compatible: one caller at a time (the engine's loop).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/drafters/cached_sequences.h"
#include "common/drafters/specdec/specdec_config.h"
#include "common/kv/paged_kv_cache.h"
#include "common/model/model_config.h"
#include "common/spec/drafter.h"

namespace specula {

class SpecDecImpl;

struct SpecDecDrafterOptions {
  std::string device = "cpu";
  std::string dtype = "float32";
  // The drafter's cache (L_e + L_d layers of the drafter's kv heads x head_dim per position).
  KvCacheOptions kv{.block_size = 16, .num_blocks = 0, .memory_mb = 128.0};
  std::string name = "specdec";  // the engine's drafter name
};

class SpecDecDrafter : public Drafter {
 public:
  // Loads a checkpoint directory (see SaveSpecDecDir) distilled from a target of config `target`.
  // NOT_FOUND (no checkpoint), INVALID_ARGUMENT (not a SpecDec checkpoint, another target,
  // misshaped tensors, bad options naming the field).
  static StatusOr<std::unique_ptr<SpecDecDrafter>> Load(const std::string& dir,
                                                        const ModelConfig& target,
                                                        SpecDecDrafterOptions options = {});
  // Wraps an in-memory module (tests, training), moved to the options' device and dtype.
  static StatusOr<std::unique_ptr<SpecDecDrafter>> Create(std::shared_ptr<SpecDecImpl> module,
                                                          SpecDecDrafterOptions options = {});
  ~SpecDecDrafter() override;

  std::string name() const override { return options_.name; }
  Status AddSequence(SeqId seq, const SamplingParams& sampling) override;
  void ReleaseSequence(SeqId seq) override;
  // NOT_FOUND for an unknown sequence, INVALID_ARGUMENT for a token outside the vocabulary or a
  // sequence observed twice, RESOURCE_EXHAUSTED when the cache is full. On error nothing changed.
  Status Observe(const std::vector<DrafterObservation>& observations) override;
  StatusOr<std::vector<CandidateTree>> Propose(const std::vector<DraftRequest>& requests) override;
  int64_t StateBytes() const override;

  const SpecDecConfig& config() const;
  std::shared_ptr<SpecDecImpl> module() const { return module_; }

  // --- introspection (tests) ---
  // Every token observed for `seq` (the last one pending). NOT_FOUND for an unknown sequence.
  StatusOr<std::vector<int32_t>> Tokens(SeqId seq) const;
  // Cached keys and values of `seq` in cache layer `layer` (0..L_e-1 encoder, then decoder
  // cross layers), [n, n_kv, head_dim] each.
  StatusOr<std::pair<at::Tensor, at::Tensor>> CacheOf(SeqId seq, int64_t layer) const;
  // The k slot logits [k, V] (float32, CPU) Propose drafts `seq` from; FAILED_PRECONDITION before
  // the first observed token.
  StatusOr<at::Tensor> SlotLogits(SeqId seq);

 private:
  struct State;
  SpecDecDrafter(std::shared_ptr<SpecDecImpl> module, std::unique_ptr<PagedKvCache> kv,
                 SpecDecDrafterOptions options);
  // [M, k, V] float32 CPU logits of the slots after each state's observed tokens.
  StatusOr<at::Tensor> DraftLogits(const std::vector<State*>& states);

  std::shared_ptr<SpecDecImpl> module_;
  std::unique_ptr<PagedKvCache> kv_;
  SpecDecDrafterOptions options_;
  CachedSequences<State> states_;
};

}  // namespace specula
