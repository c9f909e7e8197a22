#include "common/model/draft_head.h"

#include <limits>

#include "common/model/transformer.h"

namespace specula {

void DraftHead::Set(const torch::Tensor& lm_head_weight) {
  full_ = lm_head_weight.detach();
  rows_ = torch::Tensor();
  ids_ = torch::Tensor();
}

void DraftHead::Restrict(const std::vector<int32_t>& tokens) {
  TORCH_CHECK(full_.defined(), "DraftHead: Set was not called");
  TORCH_CHECK(!tokens.empty(), "DraftHead: an empty draft vocabulary");
  std::vector<int64_t> ids(tokens.begin(), tokens.end());
  ids_ = torch::tensor(ids, torch::kLong).to(full_.device());
  rows_ = full_.index_select(0, ids_).contiguous();
}

torch::Tensor DraftHead::operator()(const torch::Tensor& x) const {
  TORCH_CHECK(full_.defined(), "DraftHead: Set was not called");
  if (!restricted()) return ServingLinear(x, full_, {});
  torch::Tensor part = ServingLinear(x, rows_, {});  // [..., N]
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = full_.size(0);
  auto out = torch::full(shape, -std::numeric_limits<float>::infinity(), part.options());
  out.index_copy_(out.dim() - 1, ids_, part);
  return out;
}

}  // namespace specula
