// Black-box tests of the `specula` binary: generate (text and --json), bench-forward, bench-policy,
// and the CLI messages for bad model directories and prompts.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "common/engine/plain_decoder.h"
#include "common/model/cpu_runtime.h"
#include "common/tokenizer/bpe_trainer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/train/distill_dataset.h"
#include "common/util/mapped_file.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

class SpeculaCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    fs::create_directories(dir_->path() / "model");
    // A tokenizer trained on a little Python, and a random 2-layer model of its vocabulary.
    BpeTrainerOptions to;
    to.vocab_size = 300;
    to.show_progress = false;
    auto tok_json =
        TrainByteLevelBpe({"def f(x):\n    return x + 1\n", "import os\nprint(os.getcwd())\n"}, to);
    ASSERT_TRUE(tok_json.ok()) << tok_json.status();
    ASSERT_TRUE(WriteStringToFile(dir_->File("model/tokenizer.json"), *tok_json).ok());
    auto tok = Tokenizer::FromJson(*tok_json, "test");
    ASSERT_TRUE(tok.ok());
    ModelConfig c = TinyModelConfig();
    c.vocab_size = (*tok)->vocab_size();
    c.max_position_embeddings = 64;
    c.tie_word_embeddings = true;
    auto lm = MakeTinyModel(c, 5, /*weight_scale=*/4.0);  // sharper, less tie-prone logits
    ASSERT_TRUE(SaveModelDir(*lm, c, model()).ok());
    // A different random model of the same vocabulary as the draft LM.
    fs::create_directories(dir_->path() / "draft");
    auto draft = MakeTinyModel(c, 6, /*weight_scale=*/4.0);
    ASSERT_TRUE(SaveModelDir(*draft, c, dir_->File("draft")).ok());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static RunResult Run(const std::string& args) {
    const fs::path out = dir_->File("stdout.txt"), err = dir_->File("stderr.txt");
    const std::string cmd = std::string(SPECULA_BINARY_DIR) + "/bin/specula " + args + " > " +
                            out.string() + " 2> " + err.string();
    RunResult r;
    const int status = std::system(cmd.c_str());
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadFileToString(out.string()).value();
    r.err = ReadFileToString(err.string()).value();
    return r;
  }

  // A copy of the model dir whose file `name` is replaced by `contents`.
  static std::string BrokenModel(const std::string& tag, const std::string& name,
                                 const std::string& contents) {
    const fs::path broken = dir_->File(tag);
    fs::remove_all(broken);
    fs::copy(dir_->File("model"), broken);
    EXPECT_TRUE(WriteStringToFile((broken / name).string(), contents).ok());
    return broken.string();
  }

  static std::string model() { return dir_->File("model"); }
  static TempDir* dir_;
};

TempDir* SpeculaCliTest::dir_ = nullptr;

TEST_F(SpeculaCliTest, GenerateJsonMatchesInProcessGreedyDecoding) {
  RunResult r = Run("generate --model " + model() +
                    " --prompt 'def f(x):' --max-new-tokens 12 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"text", "token_ids", "prompt_tokens", "tokens_per_s"}) {
    EXPECT_TRUE(j.contains(key)) << key << " missing from " << r.out;
  }
  EXPECT_EQ(j["token_ids"].size(), 12u);
  EXPECT_EQ(j["finish_reason"], "length");

  auto tok = Tokenizer::FromFile(model() + "/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  auto runner = ModelRunner::Load(model(), {});
  ASSERT_TRUE(runner.ok()) << runner.status();
  GenerationRequest req;
  req.prompt = (*tok)->Encode("def f(x):");
  req.max_new_tokens = 12;
  auto expected = DecodeBatch(**runner, {req});
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(j["prompt_tokens"].get<size_t>(), req.prompt.size());
  EXPECT_EQ(j["token_ids"].get<std::vector<int32_t>>(), (*expected)[0].tokens);
  EXPECT_EQ(j["text"].get<std::string>(), (*tok)->Decode((*expected)[0].tokens, true).value());
  // The weights themselves instead of their packed copy: the same tokens.
  RunResult plain = Run("generate --model " + model() +
                        " --prompt 'def f(x):' --max-new-tokens 12 --ignore-eos --json"
                        " --cpu-packed-weights=false");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(nlohmann::json::parse(plain.out)["token_ids"], j["token_ids"]);
}

TEST_F(SpeculaCliTest, GenerateStreamsTextAndSamplingIsSeeded) {
  RunResult greedy =
      Run("generate --model " + model() + " --prompt 'import os' --max-new-tokens 8 --ignore-eos");
  ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
  EXPECT_NE(greedy.err.find("8 generated"), std::string::npos) << greedy.err;
  const std::string args =
      "generate --model " + model() +
      " --prompt-ids 5,6,7 --max-new-tokens 10 --ignore-eos --json --temperature 1.0 --top-p 0.9";
  RunResult a = Run(args + " --seed 1"), b = Run(args + " --seed 1"), c = Run(args + " --seed 2");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  auto ids = [](const RunResult& r) { return nlohmann::json::parse(r.out)["token_ids"]; };
  EXPECT_EQ(ids(a), ids(b));
  EXPECT_NE(ids(a), ids(c));
}

TEST_F(SpeculaCliTest, BenchForwardWritesJson) {
  const std::string json_path = dir_->File("bench.json");
  RunResult r =
      Run("bench-forward --model " + model() +
          " --batch-sizes 1,4 --tokens-per-seq 1,8 --contexts 8 --repeats 2 --json " + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(ReadFileToString(json_path).value());
  ASSERT_EQ(j["results"].size(), 4u);
  EXPECT_EQ(j["results"][3]["tokens"], 32);
  EXPECT_GT(j["results"][0]["median_ms"].get<double>(), 0.0);
  EXPECT_EQ(j["cpu_packed_weights"], true);
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos);
}

// A drafter's table needs context + repeats + 2 positions (each timed Observe commits a token):
// a context that does not fit is named on stderr, and a drafter left with no row at all is an
// error naming the flags, not an empty table (the test model has 64 positions).
TEST_F(SpeculaCliTest, BenchForwardNamesDrafterSettingsThatDoNotFit) {
  const std::string json_path = dir_->File("bench-drafters.json");
  const std::string base = "bench-forward --model " + model() +
                           " --batch-sizes 1 --tokens-per-seq 1 --drafter ngram --draft-depths 2"
                           " --json " +
                           json_path;
  RunResult some = Run(base + " --contexts 8,40 --repeats 24");
  ASSERT_EQ(some.exit_code, 0) << some.err;
  auto j = nlohmann::json::parse(ReadFileToString(json_path).value());
  ASSERT_EQ(j["drafters"].size(), 1u);
  EXPECT_EQ(j["drafters"][0]["context"], 8);
  EXPECT_NE(some.err.find("ngram at context 40 skipped"), std::string::npos) << some.err;

  RunResult none = Run(base + " --contexts 40 --repeats 40");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("no --contexts value leaves room to time ngram"), std::string::npos)
      << none.err;
  EXPECT_NE(none.err.find("--repeats (40)"), std::string::npos) << none.err;

  // The target's table names a context beyond the model's positions too.
  RunResult target = Run("bench-forward --model " + model() +
                         " --batch-sizes 1 --tokens-per-seq 1,32 --contexts 8,40,100 --repeats 2"
                         " --json " +
                         dir_->File("bench-target.json"));
  ASSERT_EQ(target.exit_code, 0) << target.err;
  EXPECT_NE(target.err.find("context 100 skipped"), std::string::npos) << target.err;
  EXPECT_NE(target.err.find("32 tokens per sequence at context 40 skipped"), std::string::npos)
      << target.err;
}

TEST_F(SpeculaCliTest, BenchPolicyWritesJsonAndNamesBadFlags) {
  const std::string json_path = dir_->File("policy.json");
  RunResult r =
      Run("bench-policy --batch-sizes 1,64 --warmup-steps 300 --steps 50 --json " + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(ReadFileToString(json_path).value());
  ASSERT_EQ(j["results"].size(), 4u);  // idle and pays x batch 1 and 64
  for (const auto& row : j["results"]) {
    EXPECT_GT(row["plan_us"]["median"].get<double>(), 0.0);
    EXPECT_GT(row["synthetic_tokens_per_s"].get<double>(), 0.0);
  }
  // The cheap drafter drafts at batch 64, where its call is shared by the batch; the one that
  // never pays only explores.
  EXPECT_EQ(j["results"][3]["scenario"], "pays");
  EXPECT_GT(j["results"][3]["drafted_sequence_steps"].get<double>(), 0.5);
  EXPECT_LT(j["results"][1]["drafted_sequence_steps"].get<double>(), 0.05);
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--scenarios busy", "--scenarios"},
           {"--steps 0", "--steps"},
           {"--batch-sizes 0", "--batch-sizes"},
           {"--draft-cap 300", "--draft-cap"},
           {"--context 0", "--context"},
           {"--json /nonexistent/dir/x.json --steps 1 --warmup-steps 0 --batch-sizes 1",
            "--json"}}) {
    r = Run("bench-policy " + flags);
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << ": " << r.err;
  }
}

TEST_F(SpeculaCliTest, SpeculativeGenerateIsLosslessAndReportsItsStats) {
  const std::string base = "generate --model " + model() +
                           " --prompt 'def f(x):\n    return x' --max-new-tokens 20 --ignore-eos "
                           "--json --drafter-model " +
                           dir_->File("draft");
  RunResult plain = Run(base + " --drafter none");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto expected = nlohmann::json::parse(plain.out)["token_ids"];
  for (const std::string drafter : {"ngram", "draft-model"}) {
    for (const std::string extra : {"--draft-len 3", "--draft-len 5 --tree-width 2"}) {
      RunResult r = Run(base + " --drafter " + drafter + " " + extra);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j["token_ids"], expected) << drafter << " " << extra;
      for (const char* key : {"steps", "draft_tokens", "accepted_tokens", "mean_accepted_len"}) {
        EXPECT_TRUE(j.contains(key)) << key;
      }
      EXPECT_EQ(j["drafter"], drafter);
      EXPECT_EQ(j["lossy"], false);
      EXPECT_GT(j["draft_tokens"].get<int64_t>(), 0) << drafter;
      EXPECT_EQ(j["token_ids"].size(),
                1 + j["steps"].get<size_t>() + j["accepted_tokens"].get<size_t>());
    }
  }
  RunResult lossy = Run(base + " --drafter ngram --verify specdec --beta 3 --tau 1");
  ASSERT_EQ(lossy.exit_code, 0) << lossy.err;
  EXPECT_EQ(nlohmann::json::parse(lossy.out)["lossy"], true);
  RunResult text = Run("generate --model " + model() +
                       " --prompt 'import os' --max-new-tokens 8 --drafter ngram --verify typical");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.err.find("LOSSY verification"), std::string::npos) << text.err;
}

TEST_F(SpeculaCliTest, SpeculationFlagErrors) {
  const std::string base = "generate --model " + model() + " --prompt x --max-new-tokens 4";
  RunResult r = Run(base + " --drafter medusa");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown drafter 'medusa'"), std::string::npos) << r.err;
  r = Run(base + " --drafter draft-model");
  EXPECT_NE(r.err.find("needs --drafter-model"), std::string::npos) << r.err;
  r = Run(base + " --drafter draft-model --drafter-model " + dir_->File("nope"));
  EXPECT_NE(r.err.find("--drafter-model"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << r.err;
  r = Run(base + " --drafter beagle");
  EXPECT_NE(r.err.find("--drafter beagle needs --beagle-model DIR"), std::string::npos) << r.err;
  r = Run(base + " --drafter beagle-chain --beagle-model " + dir_->File("nope"));
  EXPECT_NE(r.err.find("--beagle-model"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << r.err;
  r = Run(base + " --drafter parallelspec");
  EXPECT_NE(r.err.find("--drafter parallelspec needs --parallelspec-model DIR"), std::string::npos)
      << r.err;
  r = Run(base + " --drafter parallelspec-chain --parallelspec-model " + dir_->File("nope"));
  EXPECT_NE(r.err.find("--parallelspec-model"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << r.err;
  r = Run(base + " --drafter parallelspec-static --parallelspec-model " + dir_->File("nope"));
  EXPECT_NE(r.err.find("needs --parallelspec-static-tree FILE"), std::string::npos) << r.err;
  r = Run(base + " --drafter parallelspec-static --parallelspec-model " + dir_->File("nope") +
          " --parallelspec-static-tree " + dir_->File("nope.json"));
  EXPECT_NE(r.err.find("--parallelspec-static-tree"), std::string::npos) << r.err;
  r = Run(base + " --drafter specdec");
  EXPECT_NE(r.err.find("--drafter specdec needs --specdec-model DIR"), std::string::npos) << r.err;
  r = Run(base + " --drafter specdec --specdec-model " + dir_->File("nope"));
  EXPECT_NE(r.err.find("--specdec-model"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << r.err;
  r = Run(base + " --drafter ngram --verify greedy --temperature 0.5");
  EXPECT_NE(r.err.find("--verify greedy needs --temperature 0"), std::string::npos) << r.err;
  r = Run(base + " --drafter ngram --verify magic");
  EXPECT_NE(r.err.find("--verify"), std::string::npos) << r.err;
  r = Run(base + " --drafter ngram --draft-len -2");
  EXPECT_NE(r.err.find("--draft-len must be in [0, 256], got -2"), std::string::npos) << r.err;
  r = Run(base + " --drafter ngram --draft-len 1000");  // issue 19.8
  EXPECT_NE(r.err.find("--draft-len must be in [0, 256], got 1000"), std::string::npos) << r.err;
  r = Run(base + " --drafter ngram --draft-budget adaptive --max-draft-slowdown nan");
  EXPECT_NE(r.err.find("--max-draft-slowdown must be a finite number"), std::string::npos) << r.err;
  r = Run(base + " --drafter ngram --draft-budget adaptive --max-prefill-step-slowdown inf");
  EXPECT_NE(r.err.find("--max-prefill-step-slowdown must be a finite number"), std::string::npos)
      << r.err;
  r = Run(base + " --drafter ngram --draft-budget adaptive --draft-margin -0.5");
  EXPECT_NE(r.err.find("--draft-margin must be a finite number >= 0, got -0.5"), std::string::npos)
      << r.err;
  r = Run(base + " --drafter ngram --step-trace " + dir_->File("t.jsonl"));
  EXPECT_NE(r.err.find("--step-trace traces the adaptive draft budget's plans: it needs "
                       "--draft-budget adaptive"),
            std::string::npos)
      << r.err;
  r = Run(base + " --drafter ngram --draft-budget adaptive --step-trace " +
          dir_->File("no-such-dir/t.jsonl"));
  EXPECT_NE(r.err.find("--step-trace: cannot create"), std::string::npos) << r.err;
  r = Run(base + " --drafter ngram --drafter-context 1");
  EXPECT_NE(r.err.find("--drafter-context must be 0 (all) or at least 2, got 1"), std::string::npos)
      << r.err;
  r = Run(base + " --drafter ngram --ngram-min 5 --ngram-max 2");
  EXPECT_NE(r.err.find("min_ngram"), std::string::npos) << r.err;
}

TEST_F(SpeculaCliTest, BenchComparesWithNoSpeculationAndWritesJson) {
  const std::string prompts = dir_->File("prompts.jsonl");
  ASSERT_TRUE(WriteStringToFile(prompts,
                                "{\"prompt\": \"def f(x):\\n    return x\"}\n"
                                "{\"prompt_ids\": [5, 6, 7, 8]}\n")
                  .ok());
  const std::string json_path = dir_->File("spec_bench.json");
  RunResult r = Run("bench --model " + model() + " --drafter ngram,draft-model --drafter-model " +
                    dir_->File("draft") + " --prompts " + prompts +
                    " --batch-sizes 1,3 --draft-lens 2,4 --max-new-tokens 10 --repeats 2 "
                    "--min-requests 2 --json " +
                    json_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("speedup"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(ReadFileToString(json_path).value());
  ASSERT_EQ(j["results"].size(), 2u * (1 + 2 * 2));
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["repeats"].size(), 2u);
    EXPECT_EQ(row["output_mismatches"], 0) << row.dump();
    EXPECT_EQ(row["draft_errors"], 0) << row.dump();
    EXPECT_EQ(row["repeats"][0]["draft_errors"], 0) << row.dump();
    EXPECT_GT(row["tokens_per_s_median"].get<double>(), 0.0);
    if (row["drafter"] == "none") {
      EXPECT_DOUBLE_EQ(row["speedup_median"].get<double>(), 1.0);
    } else {
      EXPECT_GE(row["mean_accepted_len"].get<double>(), 1.0);
    }
    // At least --min-requests requests per run: batch 1 runs 2 (in two waves), batch 3 runs 3.
    EXPECT_EQ(row["repeats"][0]["tokens"], 10 * std::max<int64_t>(2, row["batch_size"]));
  }
  EXPECT_EQ(j["min_requests"], 2);
  r = Run("bench --model " + model() + " --prompts " + dir_->File("missing.jsonl"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing.jsonl"), std::string::npos) << r.err;
  ASSERT_TRUE(WriteStringToFile(prompts, "{\"prompt\": 3}\n").ok());
  r = Run("bench --model " + model() + " --prompts " + prompts);
  EXPECT_NE(r.err.find("line 1"), std::string::npos) << r.err;
}

// --interleave-requests: the settings take turns within each repeat; every run still covers all
// its requests, checked against the same reference, and adds up its turns.
TEST_F(SpeculaCliTest, BenchInterleavesSettingsInTurnsOfRequests) {
  const std::string prompts = dir_->File("turn_prompts.jsonl");
  ASSERT_TRUE(WriteStringToFile(prompts,
                                "{\"prompt\": \"def f(x):\\n    return x\"}\n"
                                "{\"prompt_ids\": [5, 6, 7, 8]}\n"
                                "{\"prompt_ids\": [9, 10, 11]}\n")
                  .ok());
  const std::string base = "bench --model " + model() + " --drafter ngram --prompts " + prompts +
                           " --batch-sizes 1,2 --draft-lens 2,adaptive --max-new-tokens 8 "
                           "--repeats 2 --min-requests 5";
  const std::string json_path = dir_->File("turns.json");
  const std::string trace_path = dir_->File("turns_trace.jsonl");
  RunResult r = Run(base + " --interleave-requests 1 --baseline-again --json " + json_path +
                    " --step-trace " + trace_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The adaptive setting's steps, one line each, labelled by batch size and phase: a repeat's
  // lines carry all of its tokens.
  std::map<std::string, int64_t> traced_tokens;
  std::stringstream trace(ReadFileToString(trace_path).value());
  for (std::string text; std::getline(trace, text);) {
    const auto line = nlohmann::json::parse(text);
    traced_tokens[line["label"].get<std::string>()] += line["new_tokens"].get<int64_t>();
    EXPECT_TRUE(line.contains("wall_ms") && line.contains("target_ms")) << text;
  }
  EXPECT_TRUE(traced_tokens.count("ngram adaptive b1 warm-up"))
      << ReadFileToString(trace_path)->substr(0, 400);
  for (const char* label : {"ngram adaptive b1 repeat 1", "ngram adaptive b1 repeat 2",
                            "ngram adaptive b2 repeat 1", "ngram adaptive b2 repeat 2"}) {
    EXPECT_EQ(traced_tokens[label], 8 * 5) << label;
  }
  auto j = nlohmann::json::parse(ReadFileToString(json_path).value());
  EXPECT_EQ(j["interleave_requests"], 1);
  // none, none again (--baseline-again), ngram k=2, ngram adaptive; per batch size.
  ASSERT_EQ(j["results"].size(), 2u * 4);
  int again = 0;
  for (const auto& row : j["results"]) {
    if (row["baseline_again"].get<bool>()) {
      ++again;
      EXPECT_EQ(row["drafter"], "none") << row.dump();
      EXPECT_EQ(row["mean_draft_budget"], 0.0) << row.dump();
      EXPECT_GT(row["speedup_median"].get<double>(), 0.0) << row.dump();
    }
    EXPECT_EQ(row["output_mismatches"], 0) << row.dump();
    EXPECT_EQ(row["draft_errors"], 0) << row.dump();
    for (const auto& rep : row["repeats"]) {
      // 5 requests: batch 1 in 5 turns, batch 2 in turns of a whole wave (2, 2, 1).
      EXPECT_EQ(rep["tokens"], 8 * 5) << row.dump();
      EXPECT_GT(rep["seconds"].get<double>(), 0.0);
      EXPECT_GE(rep["engine_steps"].get<int64_t>(), 8) << row.dump();
    }
  }
  EXPECT_EQ(again, 2);
  EXPECT_NE(r.out.find("none again"), std::string::npos) << r.out;
  r = Run(base + " --interleave-requests -1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--interleave-requests must be 0 or positive, got -1"), std::string::npos)
      << r.err;
}

TEST_F(SpeculaCliTest, BenchCountsOpsPerEngineStepWhenAsked) {
  const std::string prompts = dir_->File("ops_prompts.jsonl");
  ASSERT_TRUE(WriteStringToFile(prompts, "{\"prompt\": \"def f(x):\\n    return x\"}\n").ok());
  const std::string base = "bench --model " + model() + " --drafter ngram --prompts " + prompts +
                           " --batch-sizes 2 --draft-lens 2 --max-new-tokens 6 --repeats 1 "
                           "--min-requests 2 --json ";
  RunResult r = Run(base + dir_->File("no_ops.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("ops/step"), std::string::npos) << "off unless asked: " << r.out;
  auto off = nlohmann::json::parse(ReadFileToString(dir_->File("no_ops.json")).value());
  EXPECT_TRUE(off["results"][0]["ops"].is_null());

  r = Run(base + dir_->File("ops.json") + " --count-ops");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ops/step"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(ReadFileToString(dir_->File("ops.json")).value());
  ASSERT_EQ(j["results"].size(), 2u);  // none, ngram k=2
  for (const auto& row : j["results"]) {
    const double per_step = row["ops"]["per_engine_step"].get<double>();
    // CpuForward (up to 128 rows: every step here, the prompts' too) dispatches a couple of ATen
    // calls per forward (the logits' allocation and a copy); the module's path dozens.
    EXPECT_GE(per_step, 1.0) << row.dump();
    double by_name = 0;
    for (const auto& [name, n] : row["ops"]["by_name_per_engine_step"].items()) {
      EXPECT_EQ(name.rfind("aten::", 0), 0u) << name;
      by_name += n.get<double>();
    }
    EXPECT_NEAR(by_name, per_step, 1e-6 * per_step);
  }
}

// Issue 16: a lossy rule in bench reports what it cost against the lossless baseline.
TEST_F(SpeculaCliTest, BenchReportsQualityWhenALossyRuleRuns) {
  const std::string prompts = dir_->File("quality_prompts.jsonl");
  ASSERT_TRUE(WriteStringToFile(prompts,
                                "{\"prompt\": \"def f(x):\\n    return x\"}\n"
                                "{\"prompt_ids\": [5, 6, 7, 8]}\n")
                  .ok());
  const std::string json_path = dir_->File("quality_bench.json");
  const std::string base = "bench --model " + model() + " --drafter ngram --prompts " + prompts +
                           " --batch-sizes 2 --draft-lens 3 --max-new-tokens 12 --repeats 1";
  RunResult r = Run(base + " --specdec-grid 1:0,8:20 --json " + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("LOSSY: identical"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lossless reference: target log-prob/token"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(ReadFileToString(json_path).value());
  ASSERT_EQ(j["results"].size(), 3u);  // none, then ngram k=3 at each grid point
  const auto& none = j["results"][0];
  const auto& beta1 = j["results"][1];
  ASSERT_TRUE(none["quality"].is_object()) << none.dump();
  const double lossless_log_prob = none["quality"]["mean_target_log_prob"].get<double>();
  EXPECT_LT(lossless_log_prob, 0.0);
  // beta = 1 is greedy: identical outputs, BLEU 100, the same log-probability.
  EXPECT_EQ(beta1["specdec_beta"], 1);
  EXPECT_DOUBLE_EQ(beta1["quality"]["identical_share"].get<double>(), 1.0);
  EXPECT_TRUE(beta1["quality"]["mean_first_divergence"].is_null());
  EXPECT_DOUBLE_EQ(beta1["quality"]["bleu4"].get<double>(), 100.0);
  EXPECT_NEAR(beta1["quality"]["mean_target_log_prob"].get<double>(), lossless_log_prob, 1e-6);
  EXPECT_EQ(j["results"][2]["specdec_beta"], 8);
  EXPECT_TRUE(j["results"][2]["quality"].is_object());
  // Lossless runs carry no quality block.
  r = Run(base + " --json " + json_path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(ReadFileToString(json_path).value());
  for (const auto& row : j["results"]) EXPECT_TRUE(row["quality"].is_null()) << row.dump();
  for (const std::string bad : {"3", "0:1", "2:-1", "2:x", "1.5:1"}) {
    r = Run(base + " --specdec-grid " + bad);
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_NE(r.err.find("--specdec-grid: '" + bad + "'"), std::string::npos) << r.err;
  }
}

TEST_F(SpeculaCliTest, TrainTargetPrintsProgressAndValidationAndWritesAModel) {
  // A small source tree: a few Python files, and a test/ folder that must stay out of training.
  const fs::path src = dir_->path() / "pysrc";
  fs::create_directories(src / "pkg");
  fs::create_directories(src / "test");
  for (int i = 0; i < 12; ++i) {
    std::string body;
    for (int k = 0; k < 20; ++k) {
      body += "def f" + std::to_string(i * 100 + k) + "(x):\n    return x + " + std::to_string(k) +
              "\n\n";
    }
    ASSERT_TRUE(
        WriteStringToFile((src / "pkg" / ("m" + std::to_string(i) + ".py")).string(), body).ok());
  }
  ASSERT_TRUE(WriteStringToFile((src / "test" / "test_x.py").string(), "assert True\n").ok());
  const std::string data = dir_->File("corpus");
  RunResult r = Run("prepare-corpus --source " + src.string() + " --out " + data + " --tokenizer " +
                    model() + "/tokenizer.json --validation-percent 25");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string out = dir_->File("trained");
  r = Run("train-target --data " + data + " --out " + out +
          " --layers 1 --hidden 32 --heads 2 --kv-heads 1 --intermediate 64 --max-position 64"
          " --batch-size 2 --seq-len 16 --steps 4 --warmup 1 --eval-every 2 --log-every 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string piece :
       {"step 1/4 | loss ", "tok/s", "ETA", "step 4/4", "step 2 | val loss ", "val ppl"}) {
    EXPECT_NE(r.err.find(piece), std::string::npos) << piece << " missing from:\n" << r.err;
  }
  auto info = nlohmann::json::parse(ReadFileToString(out + "/training.json").value());
  EXPECT_EQ(info["preset"], "target");
  EXPECT_EQ(info["steps"], 4);
  r = Run("generate --model " + out + " --prompt 'def f' --max-new-tokens 3 --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A trained LM fine-tuned on a self-distillation set: the records' tokens are the stream, the last
// --val-records are validation, the shape and tokenizer come from --init-from; misuse is refused.
TEST_F(SpeculaCliTest, TrainLmFineTunesOnADistillSet) {
  const int64_t vocab =
      Tokenizer::FromJson(ReadFileToString(model() + "/tokenizer.json").value(), "t")
          .value()
          ->vocab_size();
  const std::string data = dir_->File("distill.bin");
  {
    size_t present = 0;
    auto w = DistillWriter::OpenForAppend(data, static_cast<uint32_t>(vocab), &present);
    ASSERT_TRUE(w.ok()) << w.status();
    for (int32_t i = 0; i < 24; ++i) {
      std::vector<int32_t> prompt, response;
      for (int32_t k = 0; k < 6; ++k) prompt.push_back((i * 7 + k) % vocab);
      for (int32_t k = 0; k < 20; ++k) response.push_back((i + 3 * k) % vocab);
      ASSERT_TRUE((*w)->Append(prompt, response).ok());
    }
  }
  // The fixture's model with an end-of-text id (the one between records).
  const std::string init = dir_->File("eos-model");
  fs::remove_all(init);
  fs::copy(model(), init);
  auto config = nlohmann::json::parse(ReadFileToString(init + "/config.json").value());
  config["eos_token_id"] = 1;
  ASSERT_TRUE(WriteStringToFile(init + "/config.json", config.dump(2)).ok());
  const std::string out = dir_->File("tuned");
  const std::string base = "train-lm --distill-data " + data + " --out " + out;
  RunResult r = Run(base + " --init-from " + init +
                    " --val-records 4 --batch-size 2 --seq-len 16 --steps 3 --warmup 1"
                    " --eval-every 3 --log-every 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("step 3 | val loss "), std::string::npos) << r.err;
  auto info = nlohmann::json::parse(ReadFileToString(out + "/training.json").value());
  EXPECT_EQ(info["init_from"], init);
  EXPECT_EQ(info["data"], data);
  EXPECT_EQ(info["steps"], 3);
  EXPECT_GT(info["seconds_this_run"].get<double>(), 0.0);
  EXPECT_FALSE(info.contains("depth_scaled_init"));  // the base's weights, not an init
  // 20 records of 6 + 20 tokens and an end-of-text each.
  EXPECT_EQ(fs::file_size(out + "/data/train.tok"), 20u * 27u * 2u);
  EXPECT_EQ(fs::file_size(out + "/data/val.tok"), 4u * 27u * 2u);
  auto tuned_config = nlohmann::json::parse(ReadFileToString(out + "/config.json").value());
  EXPECT_EQ(tuned_config["hidden_size"], config["hidden_size"]);
  EXPECT_EQ(tuned_config["eos_token_id"], 1);
  r = Run("generate --model " + out + " --prompt 'def f' --max-new-tokens 3 --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;

  r = Run(base);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--distill-data fine-tunes a trained LM"), std::string::npos) << r.err;
  r = Run(base + " --init-from " + init + " --layers 3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--init-from fixes the model's shape"), std::string::npos) << r.err;
  r = Run(base + " --init-from " + init + " --val-records 24");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--val-records must be in [0, 24)"), std::string::npos) << r.err;
  // A base without an end-of-text id has nothing to put between records.
  r = Run(base + " --init-from " + model() + " --val-records 4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("config.json has no eos_token_id"), std::string::npos) << r.err;
  // A set made for another vocabulary.
  const std::string other = dir_->File("distill-other.bin");
  {
    size_t present = 0;
    auto w = DistillWriter::OpenForAppend(other, static_cast<uint32_t>(vocab + 1), &present);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append({1, 2}, {3}).ok());
  }
  r = Run("train-lm --distill-data " + other + " --out " + out + "-other --init-from " + init +
          " --val-records 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("was made for a vocabulary of " + std::to_string(vocab + 1) + " tokens"),
            std::string::npos)
      << r.err;
}

TEST_F(SpeculaCliTest, MissingModelDirectory) {
  RunResult r =
      Run("generate --model " + dir_->File("nope") + " --prompt-ids 1 --max-new-tokens 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("specula generate: NOT_FOUND"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nope"), std::string::npos) << r.err;
}

TEST_F(SpeculaCliTest, TruncatedSafetensorsNamesTheFile) {
  const std::string full = ReadFileToString(model() + "/model.safetensors").value();
  const std::string dir =
      BrokenModel("truncated", "model.safetensors", full.substr(0, full.size() / 2));
  RunResult r = Run("generate --model " + dir + " --prompt 'x' --max-new-tokens 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("DATA_LOSS"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
}

TEST_F(SpeculaCliTest, UnsupportedArchitectureNamesTheField) {
  std::string config = ReadFileToString(model() + "/config.json").value();
  config.replace(config.find("\"llama\""), 7, "\"gpt2\"");
  const std::string dir = BrokenModel("gpt2", "config.json", config);
  RunResult r = Run("generate --model " + dir + " --prompt 'x' --max-new-tokens 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("model_type 'gpt2' is not supported"), std::string::npos) << r.err;
}

TEST_F(SpeculaCliTest, PromptLongerThanContext) {
  std::string ids = "1";
  for (int i = 0; i < 70; ++i) ids += ",1";
  RunResult r = Run("generate --model " + model() + " --prompt-ids " + ids + " --max-new-tokens 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("prompt of 71 tokens is longer than the context length of 64"),
            std::string::npos)
      << r.err;
  r = Run("generate --model " + model() + " --prompt-ids 1,2,3 --max-new-tokens 62");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("plus max_new_tokens 62 exceeds the context length of 64"),
            std::string::npos)
      << r.err;
}

// `specula --version` and `specula version`: the project version, and the commit when the build
// knew it.
TEST(SpeculaVersionTest, PrintsTheVersion) {
  TempDir dir;
  for (const char* arg : {"--version", "version"}) {
    const std::string out = dir.File("out.txt");
    const std::string cmd = std::string(SPECULA_BINARY_DIR) + "/bin/specula " + arg + " > " + out;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << arg;
    const std::string text = ReadFileToString(out).value();
    EXPECT_TRUE(std::regex_match(
        text, std::regex("specula \\d+\\.\\d+\\.\\d+( \\(commit [0-9a-f]{7,}(-dirty)?\\))?\n"
                         "(matmuls: OpenBLAS \\w+ kernels\n)?")))
        << arg << ": " << text;
  }
}

TEST(BetterBlasCoreTest, AsksForTheBestCoreTheCpuHas) {
  const CpuVectorFeatures none, avx2{.avx2_fma = true}, avx512{.avx2_fma = true, .avx512 = true};
  EXPECT_EQ(BetterBlasCore("Prescott", avx512), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Prescott", avx2), "Haswell");
  EXPECT_EQ(BetterBlasCore("Haswell", avx512), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("SkylakeX", avx512), "");
  EXPECT_EQ(BetterBlasCore("Zen", avx2), "");
  EXPECT_EQ(BetterBlasCore("haswell", avx2), "");
  EXPECT_EQ(BetterBlasCore("Prescott", none), "");
  EXPECT_EQ(BetterBlasCore("", avx2), "Haswell");
}

// OpenBLAS's threads used to spin ~0.1 s after every matmul (a prefill), beside the engine's own
// kernel pool; ConfigureCpuThreads bounds the spin and restarts the threads, which then compute as
// before.
TEST(BoundBlasThreadSpinTest, OpenBlasSpinsAboutATenthOfAMillisecondAndStillComputes) {
  if (LoadedBlasCore().empty()) GTEST_SKIP() << "the BLAS is not OpenBLAS";
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr) GTEST_SKIP() << "the user's bound";
  ConfigureCpuThreads(2);
  EXPECT_EQ(BoundBlasThreadSpin(), kBlasThreadTimeoutLog2);
  const std::string env = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  EXPECT_EQ(env, std::to_string(kBlasThreadTimeoutLog2));
  // Large enough for OpenBLAS to split it across its (restarted) threads.
  torch::Tensor a = torch::arange(512 * 384, torch::kFloat).reshape({512, 384}).remainder(7);
  torch::Tensor b = torch::arange(384 * 256, torch::kFloat).reshape({384, 256}).remainder(5);
  torch::Tensor expected = (a.to(torch::kDouble).matmul(b.to(torch::kDouble))).to(torch::kFloat);
  EXPECT_TRUE(torch::equal(a.matmul(b), expected));
}

// OpenBLAS picks its kernels from the CPU model; on virtual machines that hide it, it falls back to
// SSE3 "Prescott" kernels (2-3x slower matmuls). `specula` switches to the best core the CPU
// supports unless OPENBLAS_CORETYPE says otherwise.
TEST(SpeculaBlasTest, RunsTheBestMatmulKernelsTheCpuSupports) {
  TempDir dir;
  const std::string out = dir.File("out.txt");
  const std::string bin = std::string(SPECULA_BINARY_DIR) + "/bin/specula --version > " + out;
  ASSERT_EQ(std::system(("env -u OPENBLAS_CORETYPE -u SPECULA_NO_BLAS_RELAUNCH " + bin).c_str()),
            0);
  const std::string text = ReadFileToString(out).value();
  if (text.find("matmuls: OpenBLAS") == std::string::npos) GTEST_SKIP() << "not OpenBLAS";
  const CpuVectorFeatures cpu = DetectCpuVectorFeatures();
  std::smatch core;
  ASSERT_TRUE(std::regex_search(text, core, std::regex("OpenBLAS (\\w+) kernels"))) << text;
  EXPECT_EQ(BetterBlasCore(core[1], cpu), "") << "still on " << core[1] << " kernels";
  // The user's choice stands.
  ASSERT_EQ(std::system(("OPENBLAS_CORETYPE=Prescott " + bin).c_str()), 0);
  EXPECT_NE(ReadFileToString(out).value().find("OpenBLAS Prescott kernels"), std::string::npos);
}

// The switch itself, in this process: kernels change between two matmuls and give the same result.
TEST(SpeculaBlasTest, SwitchesOpenBlasKernelsInProcess) {
  const std::string loaded = LoadedBlasCore();
  if (loaded.empty()) GTEST_SKIP() << "not OpenBLAS";
#if !defined(__x86_64__)
  GTEST_SKIP() << "Prescott kernels are x86-64's";
#endif
  const char* before_env = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved_env = before_env ? before_env : "";
  torch::manual_seed(3);
  const at::Tensor a = torch::randn({300, 96}), b = torch::randn({96, 280});
  const at::Tensor expected = torch::mm(a, b);
  ASSERT_TRUE(SwitchBlasCoreInProcess("Prescott"));  // every x86-64 CPU runs these
  EXPECT_EQ(LoadedBlasCore(), "Prescott");
  EXPECT_TRUE(torch::allclose(torch::mm(a, b), expected, 1e-4, 1e-4));
  ASSERT_TRUE(SwitchBlasCoreInProcess(loaded));
  EXPECT_EQ(LoadedBlasCore(), loaded);
  EXPECT_TRUE(torch::allclose(torch::mm(a, b), expected, 1e-4, 1e-4));
  if (before_env) {
    setenv("OPENBLAS_CORETYPE", saved_env.c_str(), 1);
  } else {
    unsetenv("OPENBLAS_CORETYPE");
  }
}

// draft-vocab ranks the response tokens of a distill file (not its prompts, not the held-out
// records) and writes the set a --draft-vocab loads; bad input names the flag.
TEST_F(SpeculaCliTest, DraftVocabRanksResponseTokens) {
  const std::string data = dir_->File("vocab_distill.bin");
  {
    size_t present = 0;
    auto writer = DistillWriter::OpenForAppend(data, 16, &present);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append({9, 9, 9, 9}, {3, 3, 3, 5, 5, 7}).ok());
    ASSERT_TRUE((*writer)->Append({9}, {5, 3, 1}).ok());
    ASSERT_TRUE((*writer)->Append({2}, {11, 11, 11, 11, 11}).ok());  // held out below
  }
  const std::string out = dir_->File("vocab.json");
  RunResult r = Run("draft-vocab --data " + data + " --size 2 --val-records 1 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(ReadFileToString(out).value());
  EXPECT_EQ(j["tokens"], nlohmann::json::array({3, 5}));
  EXPECT_EQ(j["vocab_size"], 16);
  EXPECT_EQ(j["counted_tokens"], 9);
  EXPECT_NEAR(j["coverage"].get<double>(), 7.0 / 9.0, 1e-9);
  r = Run("draft-vocab --data " + data + " --size 0 --out " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--size must be positive"), std::string::npos) << r.err;
  r = Run("draft-vocab --data " + data);
  EXPECT_NE(r.err.find("--out is required"), std::string::npos) << r.err;
  r = Run("draft-vocab --data " + dir_->File("nope.bin") + " --out " + out);
  EXPECT_NE(r.err.find("--data"), std::string::npos) << r.err;
  r = Run("draft-vocab --data " + data + " --val-records 3 --out " + out);
  EXPECT_NE(r.err.find("no records besides the 3 held out"), std::string::npos) << r.err;
  // A set made for this 16-token vocabulary does not load against the test model's.
  r = Run("generate --model " + model() +
          " --prompt 'import os' --max-new-tokens 4 --drafter "
          "ngram --draft-vocab " +
          out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--draft-vocab"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("made for a vocabulary of 16 tokens"), std::string::npos) << r.err;
}

TEST_F(SpeculaCliTest, BadFlags) {
  RunResult r = Run("generate --model " + model() + " --prompt x --max-new-tokens lots");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--max-new-tokens expects an integer"), std::string::npos) << r.err;
  r = Run("generate --model " + model() + " --prompt x --frobnicate");
  EXPECT_NE(r.err.find("unknown flag --frobnicate"), std::string::npos) << r.err;
  r = Run("generate --model " + model() + " --prompt x --max-new-tokens 0");
  EXPECT_NE(r.err.find("max_new_tokens must be positive"), std::string::npos) << r.err;
  r = Run("generate --model " + model() + " --prompt x --max-new-tokens 4 --temperature -1");
  EXPECT_NE(r.err.find("temperature"), std::string::npos) << r.err;
  r = Run("frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown command 'frobnicate'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace specula
