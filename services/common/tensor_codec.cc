#include "services/common/tensor_codec.h"

// Narrow ATen headers rather than <ATen/ATen.h> (or <ATen/ops/empty.h>): clang 14 cannot
// compile those in C++20 mode against LibTorch 1.13 (an incomplete c10::IValue in std::vector),
// and the fuzz targets (tests/fuzz) build this file with clang.
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace specula::services {
namespace {

StatusOr<at::ScalarType> ScalarTypeOf(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return at::kFloat;
    case v1::DTYPE_BFLOAT16:
      return at::kBFloat16;
    case v1::DTYPE_FLOAT16:
      return at::kHalf;
    case v1::DTYPE_INT32:
      return at::kInt;
    case v1::DTYPE_INT64:
      return at::kLong;
    default:
      return InvalidArgumentError(StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
}

StatusOr<v1::DType> DTypeOf(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return v1::DTYPE_FLOAT32;
    case at::kBFloat16:
      return v1::DTYPE_BFLOAT16;
    case at::kHalf:
      return v1::DTYPE_FLOAT16;
    case at::kInt:
      return v1::DTYPE_INT32;
    case at::kLong:
      return v1::DTYPE_INT64;
    default:
      return InvalidArgumentError(
          StrCat("tensors of type ", at::toString(type), " cannot be sent"));
  }
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    out += (i ? ", " : "") + (shape[i] < 0 ? std::string("*") : std::to_string(shape[i]));
  }
  return out + "]";
}

}  // namespace

v1::DType DTypeFromName(const std::string& name) {
  if (name == "float32") return v1::DTYPE_FLOAT32;
  if (name == "bfloat16") return v1::DTYPE_BFLOAT16;
  if (name == "float16") return v1::DTYPE_FLOAT16;
  return v1::DTYPE_UNSPECIFIED;
}

const char* DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return "float32";
    case v1::DTYPE_BFLOAT16:
      return "bfloat16";
    case v1::DTYPE_FLOAT16:
      return "float16";
    case v1::DTYPE_INT32:
      return "int32";
    case v1::DTYPE_INT64:
      return "int64";
    default:
      return "unspecified";
  }
}

Status EncodeTensor(const at::Tensor& tensor, v1::Tensor* out) {
  if (!tensor.defined()) return InvalidArgumentError("an undefined tensor cannot be sent");
  ASSIGN_OR_RETURN(v1::DType dtype, DTypeOf(tensor.scalar_type()));
  // The device copy may fail (device memory, a broken device): a Status, never an exception.
  try {
    const at::Tensor host = tensor.to(at::kCPU).contiguous();
    out->set_dtype(dtype);
    out->clear_shape();
    for (int64_t d : host.sizes()) out->add_shape(d);
    out->set_data(host.data_ptr(), host.numel() * host.element_size());  // x86/ARM: little-endian
  } catch (const c10::Error& e) {
    return InternalError(StrCat("cannot encode a tensor: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return InternalError(StrCat("cannot encode a tensor: ", e.what()));
  }
  return OkStatus();
}

StatusOr<at::Tensor> DecodeTensor(const v1::Tensor& tensor, const std::string& field,
                                  v1::DType expected_dtype,
                                  const std::vector<int64_t>& expected_shape) {
  if (tensor.dtype() != expected_dtype) {
    return InvalidArgumentError(StrCat(field, ".dtype: expected ", DTypeName(expected_dtype),
                                       ", got ", DTypeName(tensor.dtype())));
  }
  ASSIGN_OR_RETURN(at::ScalarType type, ScalarTypeOf(tensor.dtype()));
  std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
  bool shape_ok = shape.size() == expected_shape.size();
  for (size_t i = 0; shape_ok && i < shape.size(); ++i) {
    shape_ok = shape[i] >= 0 && (expected_shape[i] < 0 || shape[i] == expected_shape[i]);
  }
  if (!shape_ok) {
    return InvalidArgumentError(StrCat(field, ".shape: expected ", ShapeString(expected_shape),
                                       ", got ", ShapeString(shape)));
  }
  // The bound is on the product of the non-zero dimensions, not only on the element count: with
  // a 0 somewhere the count stays 0 while LibTorch's strides overflow int64 (they wrap silently:
  // [0, 2^62, 2^62] gets stride 0 for dimension 0), a tensor no later operation should see.
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  int64_t numel = 1, extent = 1;
  for (int64_t d : shape) {
    const int64_t nonzero = std::max<int64_t>(d, 1);
    if (extent > kMaxElements / nonzero) {
      return InvalidArgumentError(StrCat(field, ".shape ", ShapeString(shape), " is too large"));
    }
    extent *= nonzero;
    numel *= d;
  }
  const int64_t bytes = numel * static_cast<int64_t>(at::elementSize(type));
  if (static_cast<int64_t>(tensor.data().size()) != bytes) {
    return InvalidArgumentError(StrCat(field, ".data: ", ShapeString(shape), " ",
                                       DTypeName(tensor.dtype()), " needs ", bytes, " bytes, got ",
                                       tensor.data().size()));
  }
  // The bytes are in the message already, so the allocation is bounded by its size; still, an
  // allocation failure is the caller's Status, not an exception on its thread.
  try {
    at::Tensor out = at::detail::empty_cpu(shape, type);
    if (bytes > 0) std::memcpy(out.data_ptr(), tensor.data().data(), static_cast<size_t>(bytes));
    return out;
  } catch (const c10::Error& e) {
    return InvalidArgumentError(
        StrCat(field, ": cannot hold ", ShapeString(shape), ": ", e.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(
        StrCat(field, ": no memory for ", ShapeString(shape), " ", DTypeName(tensor.dtype())));
  }
}

}  // namespace specula::services
