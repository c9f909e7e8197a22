// loadgen/dataset.h: JSONL prompts with per-line output_len, ShareGPT conversations, random token
// ids within the range ratio, and errors that name the bad line or entry. Uses the bundled
// model's tokenizer.
#include "loadgen/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace specula::loadgen {
namespace {

const std::string kTokenizer =
    std::string(SPECULA_SOURCE_DIR) + "/models/pyllama-6m/tokenizer.json";

class DatasetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = Tokenizer::FromFile(kTokenizer).value().release(); }
  static void TearDownTestSuite() { delete tokenizer_; }
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dataset_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  static const Tokenizer& tok() { return *tokenizer_; }

  std::filesystem::path dir_;
  static Tokenizer* tokenizer_;
};

Tokenizer* DatasetTest::tokenizer_ = nullptr;

TEST_F(DatasetTest, JsonlHonoursPerLineOutputLen) {
  const std::string path = Write("p.jsonl",
                                 "{\"prompt\": \"import os\\n\", \"output_len\": 7}\n"
                                 "\n"
                                 "{\"prompt_ids\": [5, 6, 7]}\n"
                                 "{\"prompt_ids\": [9], \"output_len\": 1}\n");
  auto d = LoadJsonlDataset(tok(), path);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 3u);
  EXPECT_EQ((*d)[0].prompt_ids, tok().Encode("import os\n", true));
  EXPECT_EQ((*d)[0].output_len, 7);
  EXPECT_EQ((*d)[1].prompt_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ((*d)[1].output_len, 0);  // the run's --max-new-tokens
  EXPECT_EQ((*d)[2].output_len, 1);
}

TEST_F(DatasetTest, MalformedJsonlNamesTheLine) {
  struct Case {
    std::string text;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {"{\"prompt\": \"a\"}\nnot json\n", "line 2: not a JSON object"},
           {"{\"prompt\": \"a\"}\n{\"text\": \"a\"}\n", "line 2: needs a string \"prompt\""},
           {"{\"prompt\": \"a\", \"output_len\": 0}\n", "line 1: output_len must be a positive"},
           {"{\"prompt\": \"a\", \"output_len\": \"5\"}\n", "line 1: output_len"},
           {"\n\n{\"prompt_ids\": [1, -2]}\n", "line 3: prompt_ids must be integers"},
           {"{\"prompt_ids\": []}\n", "line 1: empty prompt"},
           {"\n", "no prompts"},
       }) {
    const std::string path = Write("bad.jsonl", c.text);
    auto d = LoadJsonlDataset(tok(), path);
    ASSERT_FALSE(d.ok()) << c.text;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find(c.expected), std::string::npos) << d.status();
    EXPECT_NE(d.status().message().find(path), std::string::npos) << d.status();
  }
  EXPECT_EQ(LoadJsonlDataset(tok(), (dir_ / "missing.jsonl").string()).status().code(),
            StatusCode::kNotFound);
}

TEST_F(DatasetTest, JsonlLinesCarryTheirOwnRequestSettings) {
  const std::string path = Write(
      "mix.jsonl",
      "{\"prompt_ids\": [5], \"drafter\": \"beagle\", \"max_draft_tokens\": 6, \"temperature\": "
      "0.8, \"top_p\": 0.9, \"top_k\": 40, \"seed\": 18446744073709551615, \"ignore_eos\": false, "
      "\"stop\": [\"\\n\", \"):\"], \"cancel_after_ms\": 12.5, \"timeout_ms\": 3}\n"
      "{\"prompt_ids\": [6]}\n");
  auto d = LoadJsonlDataset(tok(), path);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u);
  const RequestOverrides& o = (*d)[0].overrides;
  EXPECT_EQ(o.drafter, "beagle");
  EXPECT_EQ(o.max_draft_tokens, 6);
  EXPECT_FLOAT_EQ(*o.temperature, 0.8f);
  EXPECT_FLOAT_EQ(*o.top_p, 0.9f);
  EXPECT_EQ(o.top_k, 40);
  EXPECT_EQ(o.seed, 18446744073709551615ull);
  EXPECT_EQ(o.ignore_eos, false);
  EXPECT_EQ(o.stop, (std::vector<std::string>{"\n", "):"}));
  EXPECT_DOUBLE_EQ(o.cancel_after_s, 0.0125);
  EXPECT_DOUBLE_EQ(o.timeout_s, 0.003);
  // A line without settings follows the run's flags.
  const RequestOverrides& plain = (*d)[1].overrides;
  EXPECT_FALSE(plain.drafter || plain.max_draft_tokens || plain.temperature || plain.top_p ||
               plain.top_k || plain.seed || plain.ignore_eos);
  EXPECT_TRUE(plain.stop.empty());
  EXPECT_EQ(plain.cancel_after_s, 0);
  EXPECT_EQ(plain.timeout_s, 0);
}

TEST_F(DatasetTest, MalformedRequestSettingsNameTheLineAndField) {
  for (const auto& [setting, expected] : std::vector<std::pair<std::string, std::string>>{
           {"\"drafter\": 3", "drafter must be a string"},
           {"\"max_draft_tokens\": -1", "max_draft_tokens must be an integer in [0, "},
           {"\"max_draft_tokens\": 1.5", "max_draft_tokens must be an integer"},
           {"\"temperature\": -0.1", "temperature must be a number >= 0"},
           {"\"temperature\": \"hot\"", "temperature must be a number"},
           {"\"top_p\": 0", "top_p must be a number in (0, 1]"},
           {"\"top_p\": 1.5", "top_p must be a number in (0, 1]"},
           {"\"top_k\": -3", "top_k must be an integer"},
           {"\"seed\": -1", "seed must be a non-negative integer"},
           {"\"seed\": 1.5", "seed must be a non-negative integer"},
           {"\"ignore_eos\": 1", "ignore_eos must be true or false"},
           {"\"stop\": \"x\"", "stop must be an array of non-empty strings"},
           {"\"stop\": [\"\"]", "stop must be an array of non-empty strings"},
           {"\"stop\": [1]", "stop must be an array of non-empty strings"},
           {"\"cancel_after_ms\": 0", "cancel_after_ms must be a number > 0"},
           {"\"timeout_ms\": -5", "timeout_ms must be a number > 0"},
           {"\"timeout_ms\": null", "timeout_ms must be a number > 0"},
       }) {
    const std::string path =
        Write("bad.jsonl", "{\"prompt_ids\": [1]}\n{\"prompt_ids\": [1], " + setting + "}\n");
    auto d = LoadJsonlDataset(tok(), path);
    ASSERT_FALSE(d.ok()) << setting;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("line 2: " + expected), std::string::npos)
        << setting << " -> " << d.status();
  }
}

TEST_F(DatasetTest, ShareGptTakesTheFirstHumanTurnAndTheGptReplyLength) {
  const std::string path = Write("sharegpt.json", R"json([
    {"id": "a", "conversations": [
      {"from": "system", "value": "be brief"},
      {"from": "human", "value": "def add(a, b):"},
      {"from": "gpt", "value": "    return a + b\n"},
      {"from": "human", "value": "and sub?"},
      {"from": "gpt", "value": "no"}]},
    {"id": "only-human", "conversations": [{"from": "human", "value": "hello"}]},
    {"id": "b", "conversations": [
      {"from": "user", "value": "import sys"},
      {"from": "assistant", "value": "print(sys.argv)"}]}
  ])json");
  auto d = LoadShareGptDataset(tok(), path);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u);  // the entry without a reply is skipped
  EXPECT_EQ((*d)[0].prompt_ids, tok().Encode("def add(a, b):", true));
  EXPECT_EQ((*d)[0].output_len,
            static_cast<int64_t>(tok().Encode("    return a + b\n", false).size()));
  EXPECT_EQ((*d)[1].prompt_ids, tok().Encode("import sys", true));
  EXPECT_EQ((*d)[1].output_len,
            static_cast<int64_t>(tok().Encode("print(sys.argv)", false).size()));
}

TEST_F(DatasetTest, MalformedShareGptNamesTheEntry) {
  auto error = [&](const std::string& text) {
    return LoadShareGptDataset(tok(), Write("s.json", text)).status();
  };
  EXPECT_NE(error("{\"conversations\": []}").message().find("JSON array"), std::string::npos);
  EXPECT_NE(error("[1, 2").message().find("not valid JSON"), std::string::npos);
  const Status entry = error(R"([{"conversations": [{"from": "human", "value": "a"},
                                                    {"from": "gpt", "value": "b"}]},
                                 {"turns": []}])");
  EXPECT_EQ(entry.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(entry.message().find("entry 1: needs a \"conversations\" array"), std::string::npos)
      << entry;
  const Status turn = error(R"([{"conversations": [{"from": "human"}]}])");
  EXPECT_NE(turn.message().find("entry 0: turn 0 needs string"), std::string::npos) << turn;
  EXPECT_NE(error("[]").message().find("no entry"), std::string::npos);
}

TEST_F(DatasetTest, RandomLengthsStayWithinTheRangeRatio) {
  const RandomDatasetOptions o{
      .num_prompts = 300, .input_len = 40, .output_len = 10, .range_ratio = 0.5, .seed = 3};
  auto d = RandomDataset(tok(), o);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 300u);
  int64_t min_in = 1 << 30, max_in = 0, min_out = 1 << 30, max_out = 0;
  for (const SampleRequest& r : *d) {
    const auto n = static_cast<int64_t>(r.prompt_ids.size());
    min_in = std::min(min_in, n);
    max_in = std::max(max_in, n);
    min_out = std::min(min_out, r.output_len);
    max_out = std::max(max_out, r.output_len);
    for (int32_t id : r.prompt_ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, tok().vocab_size());
      ASSERT_FALSE(tok().IsSpecial(id)) << id;
    }
  }
  EXPECT_GE(min_in, 20);
  EXPECT_LE(max_in, 60);
  EXPECT_GE(min_out, 5);
  EXPECT_LE(max_out, 15);
  EXPECT_LT(min_in, 30);  // the range is used, not just its middle
  EXPECT_GT(max_in, 50);
  // Seeded: the same prompts again.
  auto again = RandomDataset(tok(), o);
  EXPECT_EQ((*again)[17].prompt_ids, (*d)[17].prompt_ids);
}

TEST_F(DatasetTest, RandomRatioZeroGivesExactLengths) {
  auto d = RandomDataset(tok(), {.num_prompts = 5, .input_len = 12, .output_len = 3});
  ASSERT_TRUE(d.ok()) << d.status();
  for (const SampleRequest& r : *d) {
    EXPECT_EQ(r.prompt_ids.size(), 12u);
    EXPECT_EQ(r.output_len, 3);
  }
  EXPECT_EQ(RandomLengthBounds(10, 0.25, 1), (std::pair<int64_t, int64_t>{7, 13}));
  EXPECT_EQ(RandomLengthBounds(1, 0.9, 1), (std::pair<int64_t, int64_t>{1, 2}));
}

TEST_F(DatasetTest, SpreadOutputLengthsKeepsTheDatasetsOwnAndDrawsTheRest) {
  std::vector<SampleRequest> requests(400);
  requests[0].output_len = 7;  // the dataset's own length stays
  ASSERT_TRUE(SpreadOutputLengths(requests, 48, 0.5, 11).ok());
  EXPECT_EQ(requests[0].output_len, 7);
  std::set<int64_t> seen;
  for (size_t i = 1; i < requests.size(); ++i) {
    EXPECT_GE(requests[i].output_len, 24);
    EXPECT_LE(requests[i].output_len, 72);
    seen.insert(requests[i].output_len);
  }
  EXPECT_GT(seen.size(), 30u);  // spread over the range, not one length
  // Seeded: the same lengths again.
  std::vector<SampleRequest> again(400);
  again[0].output_len = 7;
  ASSERT_TRUE(SpreadOutputLengths(again, 48, 0.5, 11).ok());
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(again[i].output_len, requests[i].output_len);
  for (double ratio : {1.0, -0.5}) {
    const Status bad = SpreadOutputLengths(again, 48, ratio, 11);
    EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.message().find("--random-range-ratio"), std::string::npos) << bad;
  }
}

TEST_F(DatasetTest, RandomRejectsBadSettingsNamingTheFlag) {
  auto message = [&](const RandomDatasetOptions& o) {
    return RandomDataset(tok(), o).status().message();
  };
  EXPECT_NE(message({.num_prompts = 1, .input_len = 4, .output_len = 4, .range_ratio = 1})
                .find("--random-range-ratio"),
            std::string::npos);
  EXPECT_NE(message({.num_prompts = 1, .input_len = 0, .output_len = 4}).find("--random-input-len"),
            std::string::npos);
  EXPECT_NE(
      message({.num_prompts = 1, .input_len = 4, .output_len = 0}).find("--random-output-len"),
      std::string::npos);
}

}  // namespace
}  // namespace specula::loadgen
