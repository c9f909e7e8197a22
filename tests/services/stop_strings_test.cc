#include "services/router/stop_strings.h"

#include <gtest/gtest.h>

namespace specula::router {
namespace {

TEST(StopStringMatcherTest, NoStopsPassesTextThrough) {
  StopStringMatcher m;
  EXPECT_EQ(m.Push("abc"), "abc");
  EXPECT_EQ(m.Push(""), "");
  EXPECT_EQ(m.Flush(), "");
  EXPECT_FALSE(m.matched());
}

TEST(StopStringMatcherTest, HoldsBackWhatMayStartAStopString) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(m.Push("hello E"), "hello ");  // "E" may begin "END"
  EXPECT_EQ(m.Push("N"), "");
  EXPECT_EQ(m.Push("x"), "ENx");  // it did not
  EXPECT_EQ(m.Push(" EN"), " ");
  EXPECT_EQ(m.Flush(), "EN");  // the stream ended without a match
  EXPECT_FALSE(m.matched());
}

TEST(StopStringMatcherTest, MatchAcrossChunksEndsTheTextBeforeIt) {
  StopStringMatcher m({"\n\n"});
  EXPECT_EQ(m.Push("def f():\n"), "def f():");
  EXPECT_EQ(m.Push("\n    pass"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_stop(), "\n\n");
  EXPECT_EQ(m.Push("more"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStringMatcherTest, EarliestOfSeveralStopsWins) {
  StopStringMatcher m({"world", "lo w", "o"});
  EXPECT_EQ(m.Push("hello world"), "hel");
  EXPECT_EQ(m.matched_stop(), "lo w");
  StopStringMatcher n({"bc", "abcd"});
  EXPECT_EQ(n.Push("xabcd"), "x");  // "abcd" starts first
  EXPECT_EQ(n.matched_stop(), "abcd");
  StopStringMatcher t({"abcd", "ab"});
  EXPECT_EQ(t.Push("xabcd"), "x");  // same start: the shorter one
  EXPECT_EQ(t.matched_stop(), "ab");
}

TEST(StopStringMatcherTest, StopAtTheVeryStartAndMultibyteText) {
  StopStringMatcher m({"é"});
  EXPECT_EQ(m.Push("é tout"), "");
  EXPECT_TRUE(m.matched());
  StopStringMatcher n({"→x"});
  EXPECT_EQ(n.Push("a→"), "a");  // the whole arrow is held back, never half of it
  EXPECT_EQ(n.Push("y"), "→y");
}

}  // namespace
}  // namespace specula::router
