// Per-forward attention layout shared by every layer.
//
// The forward works on N packed tokens (rows of [N, d]) belonging to B sequences. Two modes:
//  - dense (training): the tokens ARE a [B, max_q] grid in order, keys are the same tokens
//    (max_k == max_q) and `mask` says who sees whom;
//  - paged (serving): new keys/values are written to the KV cache at write_slots and each row
//    attends to its own sequence's cache positions as `layout` lists them (PagedAttentionLayout).
//    Where the in-place kernel does not run (non-CPU devices, half precision) the layout is also
//    given in padded form: keys gathered from read_slots, queries scattered by q_index, `mask`.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace specula {

class PagedAttentionLayout;

struct AttentionInputs {
  int64_t batch = 0;
  int64_t max_q = 0;
  int64_t max_k = 0;
  at::Tensor cos;   // [N, head_dim] in the model dtype
  at::Tensor sin;   // [N, head_dim]
  at::Tensor mask;  // [B, 1, 1, max_q, max_k] bool, true = may attend (dense, padded fallback)
  // Paged mode.
  const PagedAttentionLayout* layout = nullptr;
  at::Tensor write_slots;  // [N] int64 KV slot each new token is written to (on the device)
  // Padded fallback only.
  at::Tensor q_index;     // [N] int64 row of each packed token in the [B * max_q] grid
  at::Tensor read_slots;  // [B * max_k] int64 KV slots gathered as keys
  at::Tensor sin_signed;  // SignedSin(sin), for ApplyRopeSigned
  at::Tensor bias;        // `mask` as [B, 1, max_q, 1, max_k] in the model dtype: 0 or -inf
  bool paged() const { return layout != nullptr; }
  bool padded() const { return q_index.defined(); }
};

// One layer's KV storage: [num_slots, n_kv, head_dim] each.
struct LayerKvCache {
  at::Tensor keys;
  at::Tensor values;
};

}  // namespace specula
