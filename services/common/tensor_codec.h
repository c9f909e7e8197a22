// at::Tensor <-> specula.v1.Tensor (proto/specula/v1/tensor.proto): dtype, shape and raw
// little-endian bytes. Decoding checks everything a peer could get wrong and names the field.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "common/util/status.h"
#include "specula/v1/tensor.pb.h"

namespace specula::services {

// INVALID_ARGUMENT for a dtype the protocol has no name for. Copies to host memory first.
Status EncodeTensor(const at::Tensor& tensor, v1::Tensor* out);

// `field` names the message field in errors, e.g. "observe.observations[2].hidden[0]".
// INVALID_ARGUMENT when the dtype is not `expected_dtype`, the shape is not `expected_shape`
// (-1 = any size in that dimension), or the bytes do not hold exactly prod(shape) elements.
StatusOr<at::Tensor> DecodeTensor(const v1::Tensor& tensor, const std::string& field,
                                  v1::DType expected_dtype,
                                  const std::vector<int64_t>& expected_shape);

// "float32" / "bfloat16" / "float16" <-> DType; DTYPE_UNSPECIFIED for other names.
v1::DType DTypeFromName(const std::string& name);
const char* DTypeName(v1::DType dtype);

}  // namespace specula::services
