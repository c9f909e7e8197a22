// Per-forward attention layout shared by every layer.
//
// The forward works on N packed tokens (rows of [N, d]) belonging to B sequences. Attention runs on
// a padded view: queries [B, max_q], keys [B, max_k]. Two modes:
//  - dense (training): the tokens ARE the [B, max_q] grid in order and keys are the same tokens
//    (max_k == max_q); q_index, write_slots and read_slots are undefined;
//  - paged (serving): new keys/values are written to the KV cache at write_slots, then keys are
//    gathered from read_slots (the whole prefix plus the new tokens), and q_index scatters packed
//    tokens into the padded grid.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace specula {

struct AttentionInputs {
  int64_t batch = 0;
  int64_t max_q = 0;
  int64_t max_k = 0;
  at::Tensor cos;      // [N, head_dim] in the model dtype
  at::Tensor sin;      // [N, head_dim]
  at::Tensor mask;     // [B, 1, 1, max_q, max_k] bool, true = may attend
  at::Tensor q_index;  // [N] int64 row of each packed token in the [B * max_q] grid (paged only)
  at::Tensor write_slots;  // [N] int64 KV slot each new token is written to (paged only)
  at::Tensor read_slots;   // [B * max_k] int64 KV slots gathered as keys (paged only; padding -> 0)
  bool paged() const { return write_slots.defined(); }
};

// One layer's KV storage: [num_slots, n_kv, head_dim] each.
struct LayerKvCache {
  at::Tensor keys;
  at::Tensor values;
};

}  // namespace specula
