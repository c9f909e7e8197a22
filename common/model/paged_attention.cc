#include "common/model/paged_attention.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "common/model/cpu_kernels.h"
#include "common/model/rope.h"

namespace specula {

bool PagedKernelSupports(at::Device device, at::ScalarType dtype) {
  return device.is_cpu() && dtype == at::kFloat;
}

AttentionInputs MakePagedInputs(const PagedAttentionLayout& layout, at::Tensor cos,
                                at::Tensor sin) {
  if (!PagedKernelSupports(cos.device(), cos.scalar_type())) {
    return MakePaddedInputs(layout, std::move(cos), std::move(sin));
  }
  AttentionInputs in;
  in.layout = &layout;
  in.batch = layout.num_sequences();
  in.cos = std::move(cos);
  in.sin = std::move(sin);
  return in;
}

AttentionInputs MakePaddedInputs(const PagedAttentionLayout& layout, at::Tensor cos,
                                 at::Tensor sin) {
  AttentionInputs in;
  in.layout = &layout;
  in.batch = layout.num_sequences();
  const auto device = cos.device();
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong);
  auto to_device = [&](const std::vector<int64_t>& v) {
    // from_blob does not own the vector: clone on CPU so the tensor outlives the caller's data.
    auto t = torch::from_blob(const_cast<int64_t*>(v.data()), {static_cast<int64_t>(v.size())},
                              long_opts);
    return device.is_cpu() ? t.clone() : t.to(device);
  };
  in.cos = std::move(cos);
  in.sin = std::move(sin);
  in.write_slots = to_device(layout.write_slots());
  PagedAttentionLayout::Padded padded = layout.ToPadded();
  in.max_q = padded.max_q;
  in.max_k = padded.max_k;
  in.q_index = to_device(padded.q_index);
  in.read_slots = to_device(padded.read_slots);
  in.mask = torch::from_blob(padded.mask.data(), {in.batch, 1, 1, in.max_q, in.max_k},
                             torch::TensorOptions().dtype(torch::kBool))
                .to(device, /*non_blocking=*/false, /*copy=*/true);
  // Built once per forward for every layer (each op on a device is a launch): the rotation's
  // signed sin, and the mask as an additive bias (one add per layer instead of a scale, a
  // logical_not, an expanded copy and a masked_fill).
  in.sin_signed = SignedSin(in.sin);
  in.bias = torch::zeros({in.batch, 1, in.max_q, 1, in.max_k}, in.cos.options())
                .masked_fill_(in.mask.view({in.batch, 1, in.max_q, 1, in.max_k}).logical_not(),
                              -std::numeric_limits<float>::infinity());
  return in;
}

namespace {

// q and k as one [N, nh + nkv, hd] view when they are adjacent heads of one fused projection (the
// serving path's qkv matmul): one rotation instead of two. Undefined otherwise. Adjacent addresses
// alone do not make one projection: the CUDA caching allocator puts separate small tensors back to
// back, and a view over both would run past q's storage.
at::Tensor AdjacentHeads(const at::Tensor& q, const at::Tensor& k) {
  if (!q.has_storage() || !k.has_storage() || !q.storage().is_alias_of(k.storage()) ||
      q.dim() != 3 || k.dim() != 3 || q.size(0) != k.size(0) || q.size(2) != k.size(2) ||
      // A dimension of size 1 may report any stride (views of one row do).
      (q.size(0) > 1 && q.stride(0) != k.stride(0)) || q.stride(1) != k.stride(1) ||
      q.stride(2) != k.stride(2) || q.scalar_type() != k.scalar_type() ||
      q.stride(1) != q.size(2) || q.stride(2) != 1) {
    return {};
  }
  const char* q_end =
      static_cast<const char*>(q.data_ptr()) + q.size(1) * q.stride(1) * q.element_size();
  if (static_cast<const char*>(k.data_ptr()) != q_end) return {};
  return q.as_strided({q.size(0), q.size(1) + k.size(1), q.size(2)}, q.strides());
}

// MaskedAttention's arithmetic for the padded serving path with a precomputed additive bias:
// q [B, Tq, nh, hd], k/v [B, Tk, nkv, hd], bias [B, 1, Tq, 1, Tk]. Returns [B, Tq, nh, hd].
at::Tensor BiasedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& bias) {
  const int64_t B = q.size(0), Tq = q.size(1), nh = q.size(2), hd = q.size(3);
  const int64_t Tk = k.size(1), nkv = k.size(2), group = nh / nkv;
  auto qg =
      q.view({B, Tq, nkv, group, hd}).permute({0, 2, 1, 3, 4}).reshape({B, nkv, Tq * group, hd});
  auto scores = torch::matmul(qg, k.permute({0, 2, 3, 1}));  // [B, nkv, Tq * g, Tk]
  // bias + scale * scores in one op, broadcast over the kv heads and the group.
  scores = torch::add(bias, scores.view({B, nkv, Tq, group, Tk}),
                      1.0 / std::sqrt(static_cast<double>(hd)));
  auto probs =
      torch::softmax(scores.view({B, nkv, Tq * group, Tk}), -1, torch::kFloat).to(q.scalar_type());
  auto out = torch::matmul(probs, v.permute({0, 2, 1, 3}));  // [B, nkv, Tq * g, hd]
  return out.view({B, nkv, Tq, group, hd}).permute({0, 2, 1, 3, 4}).reshape({B, Tq, nh, hd});
}

}  // namespace

at::Tensor PagedSelfAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const AttentionInputs& in, at::Tensor& key_cache,
                              at::Tensor& value_cache) {
  if (!in.padded()) {
    at::Tensor q_rot =
        RopeAndCacheCpu(q, k, v, in.cos, in.sin, in.layout->write_slots(), key_cache, value_cache);
    return PagedAttentionCpu(q_rot, key_cache, value_cache, *in.layout);
  }
  const int64_t nh = q.size(1), hd = q.size(2), nkv = k.size(1);
  const int64_t B = in.batch, Tq = in.max_q, Tk = in.max_k;
  at::Tensor q_rot, k_rot;
  if (const at::Tensor qk = AdjacentHeads(q, k); qk.defined()) {
    const at::Tensor qk_rot = ApplyRopeSigned(qk, in.cos, in.sin_signed);
    q_rot = qk_rot.narrow(1, 0, nh);
    k_rot = qk_rot.narrow(1, nh, nkv);
  } else {
    q_rot = ApplyRopeSigned(q, in.cos, in.sin_signed);
    k_rot = ApplyRopeSigned(k, in.cos, in.sin_signed);
  }
  auto same_type = [](const at::Tensor& t, const at::Tensor& like) {
    return t.scalar_type() == like.scalar_type() ? t : t.to(like.scalar_type());
  };
  key_cache.index_copy_(0, in.write_slots, same_type(k_rot, key_cache));
  value_cache.index_copy_(0, in.write_slots, same_type(v, value_cache));
  auto k_all = key_cache.index_select(0, in.read_slots).view({B, Tk, nkv, hd});
  auto v_all = value_cache.index_select(0, in.read_slots).view({B, Tk, nkv, hd});
  auto q_pad = torch::zeros({B * Tq, nh, hd}, q_rot.options()).index_copy(0, in.q_index, q_rot);
  return BiasedAttention(q_pad.view({B, Tq, nh, hd}), k_all, v_all, in.bias)
      .reshape({B * Tq, nh * hd})
      .index_select(0, in.q_index);
}

}  // namespace specula
