#include "common/model/rope.h"

#include <torch/torch.h>

#include <cmath>
#include <vector>

namespace specula {

at::Tensor RopeInverseFrequencies(const ModelConfig& config, at::Device device) {
  const int64_t dim = config.head_dim;
  // Same float32 arithmetic as HF: base ** (arange(0, dim, 2) / dim).
  auto exponents =
      torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / static_cast<float>(dim);
  auto inv_freq = 1.0 / torch::pow(static_cast<float>(config.rope_theta), exponents);
  const RopeScaling& rs = config.rope_scaling;
  if (rs.type == "linear") {
    inv_freq = inv_freq / rs.factor;
  } else if (rs.type == "llama3") {
    const double old_len = static_cast<double>(rs.original_max_position_embeddings);
    const double low_wavelen = old_len / rs.low_freq_factor;
    const double high_wavelen = old_len / rs.high_freq_factor;
    auto wavelen = 2 * M_PI / inv_freq;
    auto scaled = torch::where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq);
    auto smooth =
        (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
    auto smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled;
    auto is_medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv_freq = torch::where(is_medium, smoothed, scaled);
  }
  return inv_freq.to(torch::kFloat).to(device);
}

std::pair<at::Tensor, at::Tensor> RopeCosSin(const at::Tensor& inv_freq,
                                             const at::Tensor& positions, at::ScalarType dtype) {
  auto freqs = positions.to(torch::kFloat).unsqueeze(1) * inv_freq.unsqueeze(0);  // [N, dim/2]
  auto emb = torch::cat({freqs, freqs}, -1);                                      // [N, dim]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto rotated = torch::cat({-x2, x1}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

at::Tensor SignedSin(const at::Tensor& sin) {
  const int64_t half = sin.size(-1) / 2;
  return torch::cat({-sin.narrow(-1, 0, half), sin.narrow(-1, half, half)}, -1);
}

at::Tensor ApplyRopeSigned(const at::Tensor& x, const at::Tensor& cos,
                           const at::Tensor& sin_signed) {
  const int64_t N = x.size(0), heads = x.size(1), dim = x.size(2);
  // [x1, x2] -> [x2, x1]: one copy (flip of the halves axis).
  auto swapped = x.reshape({N, heads, 2, dim / 2}).flip({2}).view({N, heads, dim});
  return torch::addcmul(x * cos.unsqueeze(1), swapped, sin_signed.unsqueeze(1));
}

}  // namespace specula
