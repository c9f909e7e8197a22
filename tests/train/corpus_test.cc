#include "common/train/corpus.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/testing/temp_dir.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

TEST(CorpusTest, HoldsOutTestFolderAndSplitsDeterministically) {
  TempDir dir;
  const fs::path& root = dir.path();
  for (const char* rel : {"a.py", "pkg/b.py", "pkg/notes.txt", "test/test_a.py",
                          "test/support/x.py", "site-packages/thirdparty.py", "testing.py"}) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << "x = 1\n";
  }
  CorpusOptions o;
  o.root = root.string();
  o.validation_percent = 0;
  auto files = ListCorpus(o);
  ASSERT_TRUE(files.ok()) << files.status();
  std::vector<std::string> train, held;
  for (const auto& f : *files)
    (f.split == CorpusSplit::kHeldOut ? held : train).push_back(f.relative_path);
  EXPECT_EQ(train, (std::vector<std::string>{"a.py", "pkg/b.py", "testing.py"}));
  EXPECT_EQ(held, (std::vector<std::string>{"test/support/x.py", "test/test_a.py"}));

  o.validation_percent = 100;
  EXPECT_EQ(SplitOf("a.py", o), CorpusSplit::kValidation);
  EXPECT_EQ(SplitOf("test/test_a.py", o), CorpusSplit::kHeldOut);
  o.validation_percent = 50;
  EXPECT_EQ(SplitOf("json/decoder.py", o), SplitOf("json/decoder.py", o));

  o.root = (root / "missing").string();
  EXPECT_EQ(ListCorpus(o).status().code(), StatusCode::kNotFound);
}

TEST(CorpusTest, RealStdlibHasHeldOutFiles) {
  CorpusOptions o;
  auto files = ListCorpus(o);
  if (!files.ok()) GTEST_SKIP() << "no Python stdlib at " << o.root;
  int train = 0, val = 0, held = 0;
  for (const auto& f : *files) {
    train += f.split == CorpusSplit::kTrain;
    val += f.split == CorpusSplit::kValidation;
    held += f.split == CorpusSplit::kHeldOut;
    if (f.split != CorpusSplit::kHeldOut) {
      EXPECT_NE(f.relative_path.rfind("test/", 0), 0u) << f.relative_path;
    }
  }
  EXPECT_GT(train, 500);
  EXPECT_GT(val, 0);
  EXPECT_GT(held, 0);
}

}  // namespace
}  // namespace specula
