#include "common/util/status.h"

#include <gtest/gtest.h>

namespace specula {
namespace {

StatusOr<int> ParsePositive(int x) {
  if (x <= 0) return InvalidArgumentError(StrCat("x must be positive, got ", x));
  return x;
}

Status UsesMacros(int x, int* out) {
  ASSIGN_OR_RETURN(int v, ParsePositive(x));
  RETURN_IF_ERROR(v > 100 ? OutOfRangeError("too big") : OkStatus());
  *out = v;
  return OkStatus();
}

TEST(StatusTest, CodesAndMessages) {
  Status s = InvalidArgumentError("bad field 'x'");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: bad field 'x'");
  EXPECT_EQ(s.WithContext("config.json").message(), "config.json: bad field 'x'");
  EXPECT_TRUE(OkStatus().ok());
}

TEST(StatusTest, MacrosPropagate) {
  int out = 0;
  EXPECT_TRUE(UsesMacros(5, &out).ok());
  EXPECT_EQ(out, 5);
  EXPECT_EQ(UsesMacros(-1, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(UsesMacros(500, &out).code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace specula
