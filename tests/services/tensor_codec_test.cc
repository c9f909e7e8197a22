// The tensor codec at the service boundary: a malformed or hostile tensor message is a clear
// INVALID_ARGUMENT naming the field, never a LibTorch exception or a nonsense tensor.
#include "services/common/tensor_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

namespace specula::services {
namespace {

using ::testing::HasSubstr;

v1::Tensor Message(v1::DType dtype, std::vector<int64_t> shape, std::string data) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::move(data));
  return t;
}

TEST(TensorCodecTest, RoundTripsEveryDtype) {
  for (at::ScalarType type : {at::kFloat, at::kBFloat16, at::kHalf, at::kInt, at::kLong}) {
    const at::Tensor t = at::arange(12, at::TensorOptions().dtype(type)).view({3, 4});
    v1::Tensor m;
    ASSERT_TRUE(EncodeTensor(t, &m).ok());
    auto back = DecodeTensor(m, "x", m.dtype(), {-1, 4});
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(at::equal(*back, t));
  }
}

TEST(TensorCodecTest, EmptyTensorsWithHugeDimensionsAreRefused) {
  // Zero elements, so the byte count (0) matches and these were accepted; their strides overflow
  // int64 (LibTorch wraps them silently).
  for (std::vector<int64_t> shape :
       std::vector<std::vector<int64_t>>{{0, int64_t{1} << 62, int64_t{1} << 62},
                                         {0, int64_t{1} << 30, int64_t{1} << 30, int64_t{1} << 30},
                                         {int64_t{1} << 62, 0}}) {
    auto got = DecodeTensor(Message(v1::DTYPE_FLOAT32, shape, ""), "observe.hidden[0]",
                            v1::DTYPE_FLOAT32, std::vector<int64_t>(shape.size(), -1));
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(got.status().message(), HasSubstr("observe.hidden[0].shape"));
    EXPECT_THAT(got.status().message(), HasSubstr("too large"));
  }
}

TEST(TensorCodecTest, MalformedMessagesNameTheField) {
  struct Case {
    v1::Tensor message;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {Message(v1::DTYPE_INT32, {2}, std::string(8, '\0')), "t.dtype: expected float32"},
      {Message(v1::DTYPE_FLOAT32, {2, 3}, std::string(24, '\0')), "t.shape: expected [*]"},
      {Message(v1::DTYPE_FLOAT32, {-1}, ""), "t.shape"},
      {Message(v1::DTYPE_FLOAT32, {3}, std::string(8, '\0')), "t.data: [3] float32 needs 12"},
      {Message(v1::DTYPE_FLOAT32, {int64_t{1} << 41}, ""), "too large"},
  };
  for (const Case& c : cases) {
    auto got = DecodeTensor(c.message, "t", v1::DTYPE_FLOAT32, {-1});
    ASSERT_FALSE(got.ok()) << c.expect;
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(got.status().message(), HasSubstr(c.expect));
  }
}

TEST(TensorCodecTest, EncodingAnUndefinedOrUnsupportedTensorIsAnError) {
  v1::Tensor m;
  EXPECT_EQ(EncodeTensor(at::Tensor(), &m).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeTensor(at::zeros({2}, at::kBool), &m).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specula::services
