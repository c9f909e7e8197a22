#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "common/engine/plain_decoder.h"
#include "common/model/model_runner.h"
#include "common/model/transformer.h"
#include "common/train/distill_dataset.h"
#include "common/train/distiller.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

class DistillTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.File(name); }

  TempDir dir_;
};

TEST_F(DistillTest, DatasetRoundTrip) {
  size_t present = 99;
  auto w = DistillWriter::OpenForAppend(Path("d.bin"), 1000, &present);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(present, 0u);
  ASSERT_TRUE((*w)->Append({1, 2, 3}, {4, 5}).ok());
  ASSERT_TRUE((*w)->Append({999}, {}).ok());
  EXPECT_EQ((*w)->Append({1000}, {1}).code(), StatusCode::kInvalidArgument);
  w->reset();
  auto d = DistillDataset::Open(Path("d.bin"));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ(d->vocab_size(), 1000u);
  EXPECT_EQ(std::vector<uint16_t>((*d)[0].prompt.begin(), (*d)[0].prompt.end()),
            (std::vector<uint16_t>{1, 2, 3}));
  EXPECT_EQ(std::vector<uint16_t>((*d)[0].response.begin(), (*d)[0].response.end()),
            (std::vector<uint16_t>{4, 5}));
  EXPECT_EQ((*d)[1].prompt[0], 999);
  EXPECT_TRUE((*d)[1].response.empty());
  EXPECT_EQ(d->total_response_tokens(), 2);
}

// The stream a draft LM fine-tunes on: prompt, response, one end-of-text per record (not doubled
// where the target stopped on it), over the asked range only.
TEST_F(DistillTest, TokenStreamJoinsRecordsWithOneEndOfText) {
  size_t present = 0;
  auto w = DistillWriter::OpenForAppend(Path("s.bin"), 100, &present);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Append({5, 6}, {7, 8}).ok());
  ASSERT_TRUE((*w)->Append({9}, {10, 0}).ok());  // stopped on the end-of-text token 0
  ASSERT_TRUE((*w)->Append({11}, {}).ok());
  ASSERT_TRUE((*w)->Append({12}, {13}).ok());
  w->reset();
  auto d = DistillDataset::Open(Path("s.bin"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(DistillTokenStream(*d, 0, 3, 0),
            (std::vector<int32_t>{5, 6, 7, 8, 0, 9, 10, 0, 11, 0}));
  EXPECT_EQ(DistillTokenStream(*d, 3, 99, 0), (std::vector<int32_t>{12, 13, 0}));
  EXPECT_TRUE(DistillTokenStream(*d, 2, 2, 0).empty());
}

TEST_F(DistillTest, TruncatedFileIsReportedAndRepairedOnAppend) {
  size_t present = 0;
  {
    auto w = DistillWriter::OpenForAppend(Path("d.bin"), 50, &present);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append({1, 2}, {3}).ok());
    ASSERT_TRUE((*w)->Append({4, 5}, {6, 7}).ok());
  }
  fs::resize_file(Path("d.bin"), fs::file_size(Path("d.bin")) - 3);  // a killed writer
  auto broken = DistillDataset::Open(Path("d.bin"));
  EXPECT_EQ(broken.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(broken.status().message().find("truncated record after 1 complete records"),
            std::string::npos)
      << broken.status();
  auto w = DistillWriter::OpenForAppend(Path("d.bin"), 50, &present);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(present, 1u);
  ASSERT_TRUE((*w)->Append({8}, {9}).ok());
  w->reset();
  auto d = DistillDataset::Open(Path("d.bin"));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)[1].prompt[0], 8);

  EXPECT_EQ(DistillWriter::OpenForAppend(Path("d.bin"), 60, &present).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(WriteStringToFile(Path("junk.bin"), "not a dataset at all").ok());
  EXPECT_EQ(DistillDataset::Open(Path("junk.bin")).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(DistillDataset::Open(Path("missing.bin")).status().code(), StatusCode::kNotFound);
}

class DistillGenerationTest : public DistillTest {
 protected:
  void SetUp() override {
    ModelConfig c = TinyModelConfig();
    c.vocab_size = 40;
    c.tie_word_embeddings = true;
    auto module = MakeTinyModel(c, 11, /*weight_scale=*/5.0);
    auto runner = ModelRunner::FromModule(module, {});
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = std::move(*runner);
    // Training stream: ids 1..37, with 38 as "line end" and 39 as end of text.
    std::mt19937 rng(3);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 5000; ++i) {
      const uint32_t r = rng() % 100;
      tokens.push_back(r < 10 ? 38 : r < 12 ? 39 : static_cast<int32_t>(1 + rng() % 37));
    }
    ASSERT_TRUE(WriteTokenFile(Path("train.tok"), tokens).ok());
    options_.min_prompt_tokens = 4;
    options_.max_prompt_tokens = 12;
    options_.response_tokens = 9;
    options_.batch_size = 4;
    options_.num_prompts = 7;
    options_.seed = 5;
    options_.end_of_text_id = 39;
    options_.line_end_ids = {38};
    options_.quiet = true;
  }

  std::unique_ptr<ModelRunner> runner_;
  DistillOptions options_;
};

TEST_F(DistillGenerationTest, PromptsAreDeterministicLineStartsWithoutEndOfText) {
  auto train = TokenFile::Open(Path("train.tok"));
  ASSERT_TRUE(train.ok());
  for (int64_t i = 0; i < 50; ++i) {
    auto p = DistillPrompt(*train, options_, i);
    EXPECT_EQ(p, DistillPrompt(*train, options_, i));
    EXPECT_LE(p.size(), 12u);
    EXPECT_GE(p.size(), 1u);
    EXPECT_EQ(std::count(p.begin(), p.end(), 39), 0);
  }
  EXPECT_NE(DistillPrompt(*train, options_, 0), DistillPrompt(*train, options_, 1));
}

TEST_F(DistillGenerationTest, ResponsesAreGreedyTargetOutputAndResumeIsExact) {
  auto train = TokenFile::Open(Path("train.tok"));
  ASSERT_TRUE(train.ok());
  options_.out_path = Path("straight.bin");
  ASSERT_TRUE(RunDistillation(*runner_, *train, options_).ok());

  DistillOptions partial = options_;
  partial.out_path = Path("resumed.bin");
  partial.num_prompts = 3;
  ASSERT_TRUE(RunDistillation(*runner_, *train, partial).ok());
  partial.num_prompts = 7;
  ASSERT_TRUE(RunDistillation(*runner_, *train, partial).ok());
  EXPECT_EQ(ReadFileToString(Path("straight.bin")).value(),
            ReadFileToString(Path("resumed.bin")).value());

  auto d = DistillDataset::Open(Path("straight.bin"));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 7u);
  for (size_t i = 0; i < d->size(); ++i) {
    GenerationRequest r;
    r.prompt.assign((*d)[i].prompt.begin(), (*d)[i].prompt.end());
    EXPECT_EQ(r.prompt, DistillPrompt(*train, options_, static_cast<int64_t>(i)));
    r.max_new_tokens = 9;
    r.stop_token_ids = {39};
    auto expected = DecodeBatch(*runner_, {r});
    ASSERT_TRUE(expected.ok());
    EXPECT_EQ(std::vector<int32_t>((*d)[i].response.begin(), (*d)[i].response.end()),
              (*expected)[0].tokens)
        << "record " << i;
  }
}

}  // namespace
}  // namespace specula
