// loadgen/progress_bar.h: the rendered line and the on/off rule (--disable-tqdm, --progress).
#include "loadgen/progress_bar.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace specula::loadgen {
namespace {

TEST(ProgressBarTest, RendersCountsPercentAndRate) {
  const std::string line = ProgressBar::Render("run", 16, 64, 8.0);
  EXPECT_NE(line.find("run  25%|######"), std::string::npos) << line;
  EXPECT_NE(line.find("| 16/64 [00:08<00:24, 2.00 req/s]"), std::string::npos) << line;
  EXPECT_NE(ProgressBar::Render("x", 0, 0, 0).find("100%"), std::string::npos);
}

TEST(ProgressBarTest, DisableWinsOverProgress) {
  EXPECT_FALSE(ProgressBar::Enabled(/*disable=*/true, /*force=*/true));
  EXPECT_TRUE(ProgressBar::Enabled(/*disable=*/false, /*force=*/true));
}

TEST(ProgressBarTest, WritesTheFinalLineOnce) {
  char* data = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&data, &size);
  {
    ProgressBar bar(out, "warm-up", 2);
    bar.Add();
    bar.Add();
    bar.Finish();
  }  // the destructor does not draw again
  std::fclose(out);
  const std::string text(data, size);
  free(data);
  EXPECT_NE(text.find("2/2"), std::string::npos) << text;
  EXPECT_EQ(text.find('\n'), text.size() - 1) << text;
}

}  // namespace
}  // namespace specula::loadgen
