// Paged attention for every cache in the engine (the target's and the drafters'): the inputs
// builder and the attention call, which reads the cache in place on CPU (cpu_kernels) and falls
// back to a padded gather through LibTorch ops elsewhere (CUDA, half precision).
// Include only from .cc files.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/model/attention_inputs.h"
#include "common/model/paged_attention_layout.h"

namespace specula {

// Whether the in-place kernel runs for a model of this device and dtype.
bool PagedKernelSupports(at::Device device, at::ScalarType dtype);

// Paged AttentionInputs over `layout` (which must outlive them) for rows rotated by cos/sin
// [N, head_dim] (the model's device and dtype): write slots, and the padded form where the kernel
// does not run.
AttentionInputs MakePagedInputs(const PagedAttentionLayout& layout, at::Tensor cos, at::Tensor sin);
// The same, always in the padded form (what MakePagedInputs gives where the kernel does not run;
// tests force it on the CPU).
AttentionInputs MakePaddedInputs(const PagedAttentionLayout& layout, at::Tensor cos,
                                 at::Tensor sin);

// q [N, nh, hd], k/v [N, nkv, hd] of this forward's rows (q and k not yet rotated): rotates them,
// writes keys and values to the cache and returns attention over each row's visible positions,
// [N, nh * hd].
at::Tensor PagedSelfAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const AttentionInputs& in, at::Tensor& key_cache,
                              at::Tensor& value_cache);

}  // namespace specula
