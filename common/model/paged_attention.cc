#include "common/model/paged_attention.h"

#include <torch/torch.h>

#include "common/model/cpu_kernels.h"
#include "common/model/rope.h"
#include "common/model/transformer.h"

namespace specula {

bool PagedKernelSupports(at::Device device, at::ScalarType dtype) {
  return device.is_cpu() && dtype == at::kFloat;
}

AttentionInputs MakePagedInputs(const PagedAttentionLayout& layout, at::Tensor cos,
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
  if (PagedKernelSupports(device, in.cos.scalar_type())) return in;
  in.write_slots = to_device(layout.write_slots());
  PagedAttentionLayout::Padded padded = layout.ToPadded();
  in.max_q = padded.max_q;
  in.max_k = padded.max_k;
  in.q_index = to_device(padded.q_index);
  in.read_slots = to_device(padded.read_slots);
  in.mask = torch::from_blob(padded.mask.data(), {in.batch, 1, 1, in.max_q, in.max_k},
                             torch::TensorOptions().dtype(torch::kBool))
                .to(device, /*non_blocking=*/false, /*copy=*/true);
  return in;
}

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
  auto q_rot = ApplyRope(q, in.cos, in.sin);
  auto k_rot = ApplyRope(k, in.cos, in.sin);
  key_cache.index_copy_(0, in.write_slots, k_rot.to(key_cache.scalar_type()));
  value_cache.index_copy_(0, in.write_slots, v.to(value_cache.scalar_type()));
  auto k_all = key_cache.index_select(0, in.read_slots).view({B, Tk, nkv, hd});
  auto v_all = value_cache.index_select(0, in.read_slots).view({B, Tk, nkv, hd});
  auto q_pad = torch::zeros({B * Tq, nh, hd}, q_rot.options()).index_copy(0, in.q_index, q_rot);
  auto out = MaskedAttention(q_pad.view({B, Tq, nh, hd}), k_all, v_all, in.mask)
                 .reshape({B * Tq, nh * hd});
  return out.index_select(0, in.q_index);
}

}  // namespace specula
