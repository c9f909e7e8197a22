// What one model forward computes: a packed batch of sequences, each adding any number of new
// tokens after what its KV cache already holds. Torch-free: the contract between schedulers and the
// model.
#pragma once

#include <cstdint>
#include <vector>

namespace specula {

using SeqId = int64_t;

// A process-wide unique sequence id, so that every user of a runner (decoders, engines, drafters)
// can add sequences without coordinating.
SeqId NewSequenceId();

enum class LogitsRows {
  kLast,      // the last new token of the sequence (decode / prefill)
  kAll,       // every new token (tree verification)
  kNone,      // no logits (drafter-only hidden states)
  kExplicit,  // SequenceChunk::logit_rows
};

struct SequenceChunk {
  SeqId seq = 0;
  std::vector<int32_t> tokens;  // [n] new tokens
  // [n] RoPE positions; empty = cache_length + i (a plain continuation).
  std::vector<int32_t> positions;
  // [n] token tree: parents[i] is the index of i's parent among the new tokens, -1 when it hangs
  // directly off the committed prefix; parents precede children. Each token attends to the prefix,
  // its ancestors and itself. Empty = a causal chain.
  std::vector<int32_t> parents;
  LogitsRows logits = LogitsRows::kLast;
  std::vector<int32_t> logit_rows;  // with kExplicit: indices into tokens
};

struct ForwardBatch {
  std::vector<SequenceChunk> seqs;
  // Hidden states to return for every new token: 0 = embeddings, i = output of layer i,
  // L = after the final norm.
  std::vector<int64_t> hidden_layers;
};

}  // namespace specula
