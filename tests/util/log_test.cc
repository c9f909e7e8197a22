// common/util/log.h: line format (UTC timestamp, level, message), level filtering, level names.
#include "common/util/log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace specula {
namespace {

TEST(LogTest, LineHasUtcMillisecondTimestampLevelAndMessage) {
  // 2026-11-24T05:04:26.123Z
  const auto t = std::chrono::system_clock::time_point(std::chrono::milliseconds(1795496666123));
  EXPECT_EQ(FormatLogLine(t, LogLevel::kInfo, "hello"), "2026-11-24T05:04:26.123Z INFO  hello\n");
  EXPECT_EQ(FormatLogLine(t, LogLevel::kWarning, "w\n"), "2026-11-24T05:04:26.123Z WARN  w\n");
  EXPECT_EQ(FormatLogLine(t, LogLevel::kError, "e"), "2026-11-24T05:04:26.123Z ERROR e\n");
  EXPECT_EQ(FormatLogLine(t, LogLevel::kDebug, "d"), "2026-11-24T05:04:26.123Z DEBUG d\n");
}

TEST(LogTest, MessagesBelowTheLevelAreDropped) {
  std::vector<std::string> lines;
  SetLogSink([&](std::string_view line) { lines.emplace_back(line); });
  SetLogLevel(LogLevel::kWarning);
  LogDebug("d");
  LogInfo("i");
  LogWarning("w");
  LogError("e");
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo));
  EXPECT_TRUE(LogEnabled(LogLevel::kError));
  SetLogLevel(LogLevel::kOff);
  LogError("nothing");
  EXPECT_FALSE(LogEnabled(LogLevel::kOff));
  SetLogLevel(LogLevel::kInfo);
  SetLogSink(nullptr);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find(" WARN  w\n"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find(" ERROR e\n"), std::string::npos) << lines[1];
}

TEST(LogTest, ParsesLevelNames) {
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("info"), LogLevel::kInfo);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("error"), LogLevel::kError);
  EXPECT_EQ(*ParseLogLevel("off"), LogLevel::kOff);
  auto bad = ParseLogLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("got 'loud'"), std::string::npos);
}

}  // namespace
}  // namespace specula
