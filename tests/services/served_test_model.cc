#include "tests/services/served_test_model.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/drafters/draft_model_drafter.h"
#include "common/drafters/ngram_drafter.h"
#include "common/tokenizer/bpe_trainer.h"
#include "common/util/mapped_file.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"

namespace specula {

namespace fs = std::filesystem;

const TestModelDirs& TinyServedModelDirs() {
  static TempDir dir;  // removed at exit
  static const TestModelDirs* dirs = [] {
    auto* out = new TestModelDirs{dir.File("target"), dir.File("draft")};
    fs::create_directories(out->target);
    fs::create_directories(out->draft);
    BpeTrainerOptions to;
    to.vocab_size = 300;
    to.show_progress = false;
    auto tok_json =
        TrainByteLevelBpe({"def f(x):\n    return x + 1\n", "import os\nprint(os.getcwd())\n",
                           "class A:\n    def __init__(self):\n        self.x = []\n"},
                          to);
    EXPECT_TRUE(tok_json.ok()) << tok_json.status();
    auto tok = Tokenizer::FromJson(*tok_json, "test");
    EXPECT_TRUE(tok.ok()) << tok.status();
    ModelConfig c = TinyModelConfig();
    c.vocab_size = (*tok)->vocab_size();
    c.max_position_embeddings = 1024;
    c.tie_word_embeddings = true;
    for (const auto& [path, seed] : {std::pair{out->target, 5}, std::pair{out->draft, 6}}) {
      EXPECT_TRUE(WriteStringToFile(path + "/tokenizer.json", *tok_json).ok());
      auto lm = MakeTinyModel(c, seed, /*weight_scale=*/4.0);  // sharper, less tie-prone logits
      EXPECT_TRUE(SaveModelDir(*lm, c, path).ok());
    }
    return out;
  }();
  return *dirs;
}

std::unique_ptr<LocalTargetBackend> LoadTargetBackend(const std::string& target_dir,
                                                      const std::string& draft_dir,
                                                      SpecEngineOptions engine, KvCacheOptions kv,
                                                      bool step_thread) {
  ModelRunnerOptions options;
  options.kv = kv;
  auto target = ModelRunner::Load(target_dir, options);
  EXPECT_TRUE(target.ok()) << target.status();
  auto backend = std::make_unique<LocalTargetBackend>(std::move(*target), engine, step_thread);
  for (auto& d : LoadTestDrafters(target_dir, draft_dir)) {
    EXPECT_TRUE(backend->engine().AddDrafter(std::move(d)).ok());
  }
  return backend;
}

std::vector<std::unique_ptr<Drafter>> LoadTestDrafters(const std::string& target_dir,
                                                       const std::string& draft_dir) {
  std::vector<std::unique_ptr<Drafter>> drafters;
  auto ngram = NgramDrafter::Create();
  EXPECT_TRUE(ngram.ok());
  drafters.push_back(std::move(*ngram));
  if (!draft_dir.empty()) {
    auto config = ModelConfig::FromFile(target_dir + "/config.json");
    EXPECT_TRUE(config.ok()) << config.status();
    auto draft_runner = ModelRunner::Load(draft_dir, {});
    EXPECT_TRUE(draft_runner.ok()) << draft_runner.status();
    auto draft = DraftModelDrafter::Create(std::move(*draft_runner),
                                           static_cast<int32_t>(config->vocab_size));
    EXPECT_TRUE(draft.ok()) << draft.status();
    drafters.push_back(std::move(*draft));
  }
  return drafters;
}

router::ServedModel LoadServedModel(const std::string& target_dir, const std::string& draft_dir,
                                    SpecEngineOptions engine, KvCacheOptions kv) {
  router::ServedModel m;
  m.path = target_dir;
  m.name = fs::path(target_dir).filename().string();
  auto tok = Tokenizer::FromFile(target_dir + "/tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.status();
  m.tokenizer = std::move(*tok);
  m.backend = LoadTargetBackend(target_dir, draft_dir, engine, kv, /*step_thread=*/true);
  return m;
}

ReferenceDecoder::ReferenceDecoder(const std::string& dir) {
  auto runner = ModelRunner::Load(dir, {});
  EXPECT_TRUE(runner.ok()) << runner.status();
  runner_ = std::move(*runner);
  auto tok = Tokenizer::FromFile(dir + "/tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.status();
  tokenizer_ = std::move(*tok);
}

std::vector<int32_t> ReferenceDecoder::Greedy(const std::vector<int32_t>& prompt,
                                              int64_t max_new_tokens,
                                              const std::vector<int32_t>& stop_token_ids) {
  GenerationRequest r;
  r.prompt = prompt;
  r.max_new_tokens = max_new_tokens;
  r.stop_token_ids = stop_token_ids;
  auto out = DecodeBatch(*runner_, {r});
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? (*out)[0].tokens : std::vector<int32_t>{};
}

}  // namespace specula
