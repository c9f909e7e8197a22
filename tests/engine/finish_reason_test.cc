// FinishReason: the one list of reasons, its names (the Target service's wire, metric labels) and
// their parsing.
#include "common/engine/finish_reason.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>

namespace specula {
namespace {

using ::testing::HasSubstr;

TEST(FinishReasonTest, NamesAreTheWireAndLabelNames) {
  EXPECT_STREQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_STREQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_STREQ(FinishReasonName(FinishReason::kStopString), "stop_string");
  EXPECT_STREQ(FinishReasonName(FinishReason::kCancelled), "cancelled");
  EXPECT_STREQ(FinishReasonName(FinishReason::kError), "error");
}

TEST(FinishReasonTest, EveryNameParsesBackAndNamesAreDistinct) {
  std::set<std::string> names;
  for (FinishReason r : kAllFinishReasons) {
    names.insert(FinishReasonName(r));
    auto parsed = ParseFinishReason(FinishReasonName(r));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, r);
  }
  EXPECT_EQ(names.size(), std::size(kAllFinishReasons));
}

TEST(FinishReasonTest, UnknownNamesAreInvalidArgumentListingTheKnownOnes) {
  for (const char* bad : {"", "STOP", "abort", "stop "}) {
    auto parsed = ParseFinishReason(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(StrCat("'", bad, "'")));
    EXPECT_THAT(parsed.status().message(),
                HasSubstr("stop, length, stop_string, cancelled, error"));
  }
}

TEST(FinishReasonTest, StreamsItsName) {
  std::ostringstream os;
  os << FinishReason::kCancelled;
  EXPECT_EQ(os.str(), "cancelled");
}

}  // namespace
}  // namespace specula
