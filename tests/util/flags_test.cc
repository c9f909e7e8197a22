// common/util/flags.h: --help sections (Section, MoveToSection) and the ungrouped listing.
#include "common/util/flags.h"

#include <gtest/gtest.h>

#include <string>

namespace specula {
namespace {

TEST(FlagSetTest, UsageWithoutSectionsListsFlagsByName) {
  std::string b = "x";
  int64_t a = 3;
  FlagSet flags("cmd");
  flags.AddString("beta", &b, "the b");
  flags.AddInt("alpha", &a, "the a");
  EXPECT_EQ(flags.Usage(),
            "usage: specula cmd [flags]\n\nflags:\n"
            "  --alpha VALUE\n      the a (default: 3)\n"
            "  --beta VALUE\n      the b (default: x)\n");
}

TEST(FlagSetTest, SectionsListTheirFlagsInTheOrderTheyWereNamed) {
  std::string s;
  int64_t i = 0;
  bool on = false;
  double d = 1;
  FlagSet flags("serve");
  flags.AddBool("loose", &on, "no section");
  flags.Section("router");
  flags.AddString("queue", &s, "q");
  flags.Section("all roles");
  flags.AddInt("port", &i, "p");
  flags.AddDouble("grace", &d, "g");
  flags.Section("router");  // back to an earlier section
  flags.AddInt("batch", &i, "b");
  flags.MoveToSection("loose", "all roles");
  flags.MoveToSection("unknown", "router");  // no-op
  const std::string usage = flags.Usage();
  EXPECT_EQ(usage.find("flags:"), std::string::npos) << usage;
  const size_t router = usage.find("\nrouter:\n"), all = usage.find("\nall roles:\n");
  ASSERT_NE(router, std::string::npos) << usage;
  ASSERT_NE(all, std::string::npos) << usage;
  EXPECT_LT(router, all);
  // Within a section, by name.
  EXPECT_LT(router, usage.find("--batch"));
  EXPECT_LT(usage.find("--batch"), usage.find("--queue"));
  EXPECT_LT(usage.find("--queue"), all);
  EXPECT_LT(all, usage.find("--grace"));
  EXPECT_LT(usage.find("--grace"), usage.find("--loose"));
  EXPECT_LT(usage.find("--loose"), usage.find("--port"));
  // Sections change only the listing.
  ASSERT_TRUE(flags.Parse({"--port=7", "--loose", "--queue", "q1"}).ok());
  EXPECT_EQ(i, 7);
  EXPECT_TRUE(on);
  EXPECT_EQ(s, "q1");
}

TEST(FlagSetTest, SetDefaultChangesTheValueAndTheListedDefault) {
  std::string model = "a";
  int64_t n = 1;
  FlagSet flags("serve");
  flags.AddString("model", &model, "m");
  flags.AddInt("n", &n, "n");
  ASSERT_TRUE(flags.SetDefault("model", "b").ok());
  EXPECT_EQ(model, "b");
  EXPECT_NE(flags.Usage().find("(default: b)"), std::string::npos) << flags.Usage();
  EXPECT_FALSE(flags.WasSet("model"));
  EXPECT_EQ(flags.SetDefault("n", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(flags.SetDefault("missing", "1").code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(flags.Parse({"--model", "c"}).ok());
  EXPECT_EQ(model, "c");
}

}  // namespace
}  // namespace specula
