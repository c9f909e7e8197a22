// The bearer token's pure parts: the constant-time comparison and loading the token from a file or
// the environment (the per-call check runs against real servers in tls_serve_test).
#include "services/router/api_token.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "tests/testing/temp_dir.h"

namespace specula::router {
namespace {

TEST(ApiTokenTest, ConstantTimeEqualsComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", ""));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  // A prefix padded with the bytes the comparison pads with must not pass.
  EXPECT_FALSE(ConstantTimeEquals(std::string("ab\0", 3), "ab"));
}

TEST(ApiTokenTest, LoadsATrimmedTokenFromAFile) {
  TempDir dir;
  std::ofstream(dir.File("token")) << "\n  tok-123_ABC.~+/=  \r\n";
  auto token = LoadApiToken(dir.File("token"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "tok-123_ABC.~+/=");
}

TEST(ApiTokenTest, BadTokenFilesNameTheFlag) {
  TempDir dir;
  std::ofstream(dir.File("empty")) << " \n";
  std::ofstream(dir.File("spaced")) << "two words";
  std::ofstream(dir.File("utf8")) << "caf\xc3\xa9";
  for (const std::string name : {"missing", "empty", "spaced", "utf8"}) {
    auto token = LoadApiToken(dir.File(name));
    ASSERT_FALSE(token.ok()) << name;
    EXPECT_EQ(token.status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(token.status().message().find("--api-token-file"), std::string::npos)
        << token.status();
  }
}

TEST(ApiTokenTest, EnvironmentIsTheFallback) {
  ::unsetenv(kApiTokenEnv);
  auto none = LoadApiToken("");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, "");
  ::setenv(kApiTokenEnv, " env-token\n", 1);
  auto env = LoadApiToken("");
  ::setenv(kApiTokenEnv, "", 1);
  auto empty = LoadApiToken("");
  ::unsetenv(kApiTokenEnv);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(*env, "env-token");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("SPECULA_API_TOKEN"), std::string::npos);
}

TEST(ApiTokenTest, AuthIsOffWithoutAToken) {
  EXPECT_FALSE(ApiTokenAuth().enabled());
  EXPECT_TRUE(ApiTokenAuth("t").enabled());
}

}  // namespace
}  // namespace specula::router
