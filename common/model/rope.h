// Rotary position embeddings with the HF Llama conventions (rotate_half, cos/sin of cat(freqs,
// freqs)), including Llama-3 and linear rope_scaling.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

#include "common/model/model_config.h"

namespace specula {

// inv_freq [head_dim / 2] float32 on `device`.
at::Tensor RopeInverseFrequencies(const ModelConfig& config, at::Device device);

// cos and sin [N, head_dim] for positions [N] (int64), cast to `dtype`.
std::pair<at::Tensor, at::Tensor> RopeCosSin(const at::Tensor& inv_freq,
                                             const at::Tensor& positions, at::ScalarType dtype);

// x [N, heads, head_dim] rotated by cos/sin [N, head_dim].
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// sin with its first half negated, [N, head_dim]: what ApplyRopeSigned takes. One table per
// forward, shared by every layer.
at::Tensor SignedSin(const at::Tensor& sin);

// ApplyRope in three ops instead of five, for inference (LibTorch paths where each op is a
// launch): rotate_half(x) * sin == swap_halves(x) * SignedSin(sin), and x * cos plus that is one
// addcmul. x [N, heads, head_dim] (last dim contiguous).
at::Tensor ApplyRopeSigned(const at::Tensor& x, const at::Tensor& cos,
                           const at::Tensor& sin_signed);

}  // namespace specula
