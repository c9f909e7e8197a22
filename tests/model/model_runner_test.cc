#include "common/model/model_runner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common/model/checkpoint.h"
#include "common/model/transformer.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// The shared tiny config, with an end-of-sequence id that config.json must round-trip.
ModelConfig TinyConfig() {
  ModelConfig c = TinyModelConfig();
  c.eos_token_ids = {1};
  return c;
}

std::map<std::string, at::Tensor> Weights(CausalLMImpl& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// Writes config.json + model.safetensors; `edit` may change the tensors first.
void SaveModel(CausalLMImpl& model, const std::string& dir,
               const std::function<void(std::map<std::string, at::Tensor>&)>& edit = nullptr) {
  ASSERT_TRUE(SaveModelDir(model, model.config(), dir).ok());
  if (!edit) return;
  auto weights = Weights(model);
  edit(weights);
  ASSERT_TRUE(SaveSafetensorsFile(dir + "/model.safetensors", weights, {{"format", "pt"}}).ok());
}

ModelRunnerOptions Options(int64_t num_blocks = 64, int64_t block_size = 4) {
  ModelRunnerOptions o;
  o.kv.block_size = block_size;
  o.kv.num_blocks = num_blocks;
  return o;
}

std::unique_ptr<ModelRunner> Runner(std::shared_ptr<CausalLMImpl> model,
                                    const ModelRunnerOptions& options = Options()) {
  auto runner = ModelRunner::FromModule(std::move(model), options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? std::move(runner).value() : nullptr;
}

SequenceChunk Chunk(SeqId seq, std::vector<int32_t> tokens, LogitsRows logits = LogitsRows::kLast) {
  SequenceChunk c;
  c.seq = seq;
  c.tokens = std::move(tokens);
  c.logits = logits;
  return c;
}

ForwardBatch Batch(std::vector<SequenceChunk> seqs) {
  ForwardBatch b;
  b.seqs = std::move(seqs);
  return b;
}

torch::Tensor ForwardOk(ModelRunner& runner, const ForwardBatch& batch) {
  auto out = runner.Forward(batch);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? out->logits : torch::Tensor();
}

torch::Tensor ForwardOk(ModelRunner& runner, const SequenceChunk& chunk) {
  return ForwardOk(runner, Batch({chunk}));
}

// Dense (cache-free, training-path) logits for every position of one sequence.
torch::Tensor DenseLogits(CausalLMImpl& model, const std::vector<int32_t>& tokens) {
  torch::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto t = torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), torch::kLong);
  auto in = model.DenseCausalInputs(1, n, torch::arange(n, torch::kLong));
  return model.Logits(model.forward(t, in, nullptr).last_hidden);
}

torch::Tensor Row(const torch::Tensor& logits, int64_t row) { return logits[row].unsqueeze(0); }

void ExpectClose(const torch::Tensor& actual, const torch::Tensor& expected,
                 const std::string& what, double tol = 1e-5) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_TRUE(expected.defined()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double diff = (actual - expected).abs().max().item<double>();
  EXPECT_LE(diff, tol) << what << ": max |diff| = " << diff;
}

std::vector<int32_t> Tokens(int n, int start = 3) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((start + 7 * i + i * i) % 64);
  return t;
}

// ----------------------------------------------------------------------------------------------
// Save -> Load -> same logits as the in-memory module, for each architecture.

struct ArchCase {
  std::string name;
  ModelConfig config;
};

std::vector<ArchCase> ArchCases() {
  std::vector<ArchCase> cases;
  cases.push_back({"llama_gqa", TinyConfig()});
  ModelConfig tied = TinyConfig();
  tied.tie_word_embeddings = true;
  cases.push_back({"llama_tied", tied});
  ModelConfig llama3 = TinyConfig();
  llama3.rope_scaling.type = "llama3";
  llama3.rope_scaling.factor = 8.0;
  llama3.rope_scaling.original_max_position_embeddings = 16;
  llama3.rope_theta = 500000.0;
  cases.push_back({"llama3_rope", llama3});
  ModelConfig qwen2 = TinyConfig();
  qwen2.arch = Architecture::kQwen2;
  qwen2.model_type = "qwen2";
  qwen2.qkv_bias = true;
  qwen2.tie_word_embeddings = true;
  cases.push_back({"qwen2_bias", qwen2});
  ModelConfig qwen3 = TinyConfig();
  qwen3.arch = Architecture::kQwen3;
  qwen3.model_type = "qwen3";
  qwen3.qk_norm = true;
  qwen3.head_dim = 16;  // != hidden / heads
  cases.push_back({"qwen3_qknorm", qwen3});
  ModelConfig mistral = TinyConfig();
  mistral.arch = Architecture::kMistral;
  mistral.model_type = "mistral";
  mistral.sliding_window = 4;
  cases.push_back({"mistral_window", mistral});
  ModelConfig mha = TinyConfig();
  mha.num_key_value_heads = 4;
  mha.num_hidden_layers = 3;
  cases.push_back({"llama_mha_3layers", mha});
  return cases;
}

void PrintTo(const ArchCase& c, std::ostream* os) { *os << c.name; }

class LoadRoundTripTest : public ::testing::TestWithParam<ArchCase> {};

TEST_P(LoadRoundTripTest, LoadedLogitsEqualInMemoryDenseForward) {
  const ModelConfig& config = GetParam().config;
  auto model = MakeVariedTinyModel(config, 11);
  TempDir dir;
  SaveModel(*model, dir.path().string());

  auto runner = ModelRunner::Load(dir.path().string(), Options());
  ASSERT_TRUE(runner.ok()) << runner.status();
  ModelRunner& r = **runner;
  EXPECT_EQ(r.device_name(), "cpu");
  EXPECT_EQ(r.config().ToJson(), config.ToJson());

  const std::vector<int32_t> tokens = Tokens(15);
  const torch::Tensor dense = DenseLogits(*model, tokens);
  ASSERT_EQ(dense.sizes(), (std::vector<int64_t>{15, 64}));

  // Prefill 12 with every row, then decode 3 one at a time.
  ASSERT_TRUE(r.AddSequence(5).ok());
  torch::Tensor prefill = ForwardOk(
      r, Chunk(5, std::vector<int32_t>(tokens.begin(), tokens.begin() + 12), LogitsRows::kAll));
  ExpectClose(prefill, dense.slice(0, 0, 12), "prefill");
  for (int i = 12; i < 15; ++i) {
    ExpectClose(ForwardOk(r, Chunk(5, {tokens[i]})), Row(dense, i), "decode " + std::to_string(i));
  }
  EXPECT_EQ(r.SequenceLength(5), 15);

  // The parameter count the config predicts is the module's.
  int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();
  EXPECT_EQ(config.num_parameters(), numel);
}

INSTANTIATE_TEST_SUITE_P(Archs, LoadRoundTripTest, ::testing::ValuesIn(ArchCases()),
                         [](const auto& info) { return info.param.name; });

TEST(LoadTest, ShardedCheckpointWithIndex) {
  auto model = MakeVariedTinyModel(TinyConfig(), 12);
  TempDir dir;
  auto weights = Weights(*model);
  std::map<std::string, at::Tensor> shard[2];
  std::string index = R"({"metadata": {}, "weight_map": {)";
  int i = 0;
  for (const auto& [name, t] : weights) {
    const int s = i++ % 2;
    shard[s][name] = t;
    index += (i > 1 ? ", \"" : "\"") + name + "\": \"model-0000" + std::to_string(s + 1) +
             "-of-00002.safetensors\"";
  }
  index += "}}";
  ASSERT_TRUE(SaveSafetensorsFile(dir.File("model-00001-of-00002.safetensors"), shard[0]).ok());
  ASSERT_TRUE(SaveSafetensorsFile(dir.File("model-00002-of-00002.safetensors"), shard[1]).ok());
  WriteText(dir.File("model.safetensors.index.json"), index);
  WriteText(dir.File("config.json"), model->config().ToJson());

  auto runner = ModelRunner::Load(dir.path().string(), Options());
  ASSERT_TRUE(runner.ok()) << runner.status();
  const std::vector<int32_t> tokens = Tokens(9);
  ASSERT_TRUE((*runner)->AddSequence(1).ok());
  ExpectClose(ForwardOk(**runner, Chunk(1, tokens, LogitsRows::kAll)), DenseLogits(*model, tokens),
              "sharded");
}

TEST(LoadTest, Bf16CheckpointIntoFloat32Runner) {
  auto model = MakeVariedTinyModel(TinyConfig(), 13);
  TempDir dir;
  SaveModel(*model, dir.path().string(), [](auto& weights) {
    for (auto& [name, t] : weights) t = t.to(torch::kBFloat16);
  });
  // The reference: the same model with bf16-rounded weights.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.copy_(p.to(torch::kBFloat16).to(torch::kFloat));
  }
  auto runner = ModelRunner::Load(dir.path().string(), Options());
  ASSERT_TRUE(runner.ok()) << runner.status();
  const std::vector<int32_t> tokens = Tokens(6);
  ASSERT_TRUE((*runner)->AddSequence(1).ok());
  ExpectClose(ForwardOk(**runner, Chunk(1, tokens, LogitsRows::kAll)), DenseLogits(*model, tokens),
              "bf16 checkpoint");
}

// Half-precision runners on CPU: same model, logits within half-precision rounding of fp32, and
// the KV cache holds the runner's dtype.
TEST(LoadTest, HalfPrecisionRunnersTrackFloat32) {
  auto model = MakeVariedTinyModel(TinyConfig(), 14);
  TempDir dir;
  SaveModel(*model, dir.path().string());
  const std::vector<int32_t> tokens = Tokens(7);
  for (const char* dtype : {"bfloat16", "float16"}) {
    ModelRunnerOptions o = Options();
    o.dtype = dtype;
    auto runner = ModelRunner::Load(dir.path().string(), o);
    if (!runner.ok() && std::string(dtype) == "float16") {
      // LibTorch 1.13 has no float16 matmul on CPU (2.x does): then loading must say so clearly.
      EXPECT_EQ(runner.status().code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(runner.status().message(),
                  HasSubstr("dtype 'float16' is not supported on device 'cpu'"));
      continue;
    }
    ASSERT_TRUE(runner.ok()) << dtype << ": " << runner.status();
    EXPECT_EQ((*runner)->kv_cache().stats().num_blocks, 64);
    ASSERT_TRUE((*runner)->AddSequence(1).ok());
    // Prefill then one decode step, so the half-precision KV cache is read back.
    auto prefill =
        ForwardOk(**runner, Chunk(1, {tokens.begin(), tokens.end() - 1}, LogitsRows::kAll));
    auto step = ForwardOk(**runner, Chunk(1, {tokens.back()}));
    auto logits = torch::cat({prefill, step});
    ASSERT_EQ(logits.scalar_type(), torch::kFloat);
    auto reference = DenseLogits(*model, tokens);
    const double scale = reference.abs().max().item<double>();
    EXPECT_LT((logits - reference).abs().max().item<double>(), 0.05 * scale) << dtype;
  }
}

// ----------------------------------------------------------------------------------------------
// Load errors name the file / tensor at fault.

TEST(LoadErrorTest, MissingDirectory) {
  TempDir dir;
  const std::string missing = dir.File("no_such_model");
  auto r = ModelRunner::Load(missing, Options());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(missing));
}

TEST(LoadErrorTest, MissingConfigJson) {
  auto model = MakeVariedTinyModel(TinyConfig(), 1);
  TempDir dir;
  SaveModel(*model, dir.path().string());
  fs::remove(dir.File("config.json"));
  auto r = ModelRunner::Load(dir.path().string(), Options());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(dir.File("config.json")));
}

TEST(LoadErrorTest, MissingWeights) {
  TempDir dir;
  WriteText(dir.File("config.json"), TinyConfig().ToJson());
  auto r = ModelRunner::Load(dir.path().string(), Options());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr(dir.path().string()), HasSubstr("no model.safetensors")));
}

TEST(LoadErrorTest, BadConfigJson) {
  auto model = MakeVariedTinyModel(TinyConfig(), 1);
  TempDir dir;
  SaveModel(*model, dir.path().string());
  WriteText(dir.File("config.json"), "{\"model_type\": \"llama\", ");
  auto r = ModelRunner::Load(dir.path().string(), Options());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr(dir.File("config.json")));
}

TEST(LoadErrorTest, ShapeMismatchNamesTheTensor) {
  auto model = MakeVariedTinyModel(TinyConfig(), 1);  // hidden 32
  TempDir dir;
  SaveModel(*model, dir.path().string());
  ModelConfig wider = TinyConfig();
  wider.hidden_size = 48;  // head_dim stays 8 (written explicitly)
  WriteText(dir.File("config.json"), wider.ToJson());
  auto r = ModelRunner::Load(dir.path().string(), Options());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), dir.path().string() +
                                      ": tensor 'model.embed_tokens.weight' has shape [64, 32] but "
                                      "config.json implies [64, 48]");
}

TEST(LoadErrorTest, ShapeMismatchInALaterTensor) {
  auto model = MakeVariedTinyModel(TinyConfig(), 1);
  TempDir dir;
  SaveModel(*model, dir.path().string(), [](auto& weights) {
    weights["model.layers.1.self_attn.k_proj.weight"] = torch::zeros({8, 32});
  });
  auto r = ModelRunner::Load(dir.path().string(), Options());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("tensor 'model.layers.1.self_attn.k_proj.weight' has shape [8, 32] but "
                        "config.json implies [16, 32]"));
}

TEST(LoadErrorTest, MissingTensorNamesIt) {
  auto model = MakeVariedTinyModel(TinyConfig(), 1);
  TempDir dir;
  SaveModel(*model, dir.path().string(), [](auto& weights) {
    ASSERT_EQ(weights.erase("model.layers.1.mlp.up_proj.weight"), 1u);
  });
  auto r = ModelRunner::Load(dir.path().string(), Options());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            dir.path().string() + ": checkpoint has no tensor 'model.layers.1.mlp.up_proj.weight'");
}

TEST(LoadErrorTest, UntiedConfigNeedsLmHead) {
  ModelConfig tied = TinyConfig();
  tied.tie_word_embeddings = true;
  auto model = MakeVariedTinyModel(tied, 1);
  TempDir dir;
  SaveModel(*model, dir.path().string());
  WriteText(dir.File("config.json"), TinyConfig().ToJson());  // untied
  auto r = ModelRunner::Load(dir.path().string(), Options());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("no tensor 'lm_head.weight'"));
}

TEST(LoadErrorTest, NonFloatTensor) {
  auto model = MakeVariedTinyModel(TinyConfig(), 1);
  TempDir dir;
  SaveModel(*model, dir.path().string(),
            [](auto& weights) { weights["model.norm.weight"] = torch::ones({32}, torch::kInt); });
  auto r = ModelRunner::Load(dir.path().string(), Options());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr(dir.path().string()),
                    HasSubstr("tensor 'model.norm.weight' has non-float dtype")));
}

TEST(LoadErrorTest, TruncatedWeightsFile) {
  auto model = MakeVariedTinyModel(TinyConfig(), 1);
  TempDir dir;
  SaveModel(*model, dir.path().string());
  const std::string path = dir.File("model.safetensors");
  fs::resize_file(path, fs::file_size(path) - 100);
  auto r = ModelRunner::Load(dir.path().string(), Options());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr(path), HasSubstr("truncated")));
}

TEST(LoadErrorTest, BadOptions) {
  auto model = MakeVariedTinyModel(TinyConfig(), 1);
  TempDir dir;
  SaveModel(*model, dir.path().string());

  ModelRunnerOptions dtype = Options();
  dtype.dtype = "float64";
  auto r = ModelRunner::Load(dir.path().string(), dtype);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("unknown dtype 'float64'"));

  ModelRunnerOptions device = Options();
  device.device = "tpu";
  r = ModelRunner::Load(dir.path().string(), device);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("bad device 'tpu'"));

  ModelRunnerOptions no_kv = Options(0);
  no_kv.kv.memory_mb = 1e-6;
  r = ModelRunner::Load(dir.path().string(), no_kv);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("holds no block"));

  if (!torch::cuda::is_available()) {
    ModelRunnerOptions cuda = Options();
    cuda.device = "cuda";
    r = ModelRunner::Load(dir.path().string(), cuda);
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(r.status().message(), HasSubstr("'cuda'"));
  }
}

// ----------------------------------------------------------------------------------------------
// Forward validation: every rejected batch leaves every sequence as it was.

class ForwardValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = MakeVariedTinyModel(TinyConfig(), 21);
    runner_ = Runner(model_);
    ASSERT_NE(runner_, nullptr);
    ASSERT_TRUE(runner_->AddSequence(1).ok());
    ASSERT_TRUE(runner_->AddSequence(2).ok());
    ForwardOk(*runner_, Chunk(1, std::vector<int32_t>(seq1_.begin(), seq1_.begin() + 6)));
    ForwardOk(*runner_, Chunk(2, std::vector<int32_t>(seq2_.begin(), seq2_.begin() + 3)));
    free_blocks_ = runner_->kv_stats().free_blocks;
  }

  void ExpectRejected(const ForwardBatch& batch, StatusCode code, const std::string& message) {
    auto out = runner_->Forward(batch);
    ASSERT_FALSE(out.ok()) << message;
    EXPECT_EQ(out.status().code(), code) << out.status();
    EXPECT_THAT(out.status().message(), HasSubstr(message));
    EXPECT_EQ(runner_->SequenceLength(1), 6) << message;
    EXPECT_EQ(runner_->SequenceLength(2), 3) << message;
    EXPECT_EQ(runner_->kv_stats().free_blocks, free_blocks_) << message;
    EXPECT_EQ(runner_->kv_stats().num_sequences, 2) << message;
  }

  // The next valid forward gives what it would have without the rejected calls.
  void ExpectUnharmed() {
    const auto dense1 = DenseLogits(*model_, seq1_);
    const auto dense2 = DenseLogits(*model_, seq2_);
    torch::Tensor logits = ForwardOk(*runner_, Batch({Chunk(1, {seq1_[6]}), Chunk(2, {seq2_[3]})}));
    ASSERT_TRUE(logits.defined());
    ExpectClose(Row(logits, 0), Row(dense1, 6), "seq 1 after rejected calls");
    ExpectClose(Row(logits, 1), Row(dense2, 3), "seq 2 after rejected calls");
  }

  std::shared_ptr<CausalLMImpl> model_;
  std::unique_ptr<ModelRunner> runner_;
  const std::vector<int32_t> seq1_ = Tokens(7, 5);
  const std::vector<int32_t> seq2_ = Tokens(4, 40);
  int64_t free_blocks_ = 0;
};

TEST_F(ForwardValidationTest, TokenOutsideVocabulary) {
  ExpectRejected(Batch({Chunk(1, {1, 2, 64})}), StatusCode::kInvalidArgument,
                 "sequence 1: tokens[2] = 64 is outside the vocabulary [0, 64)");
  ExpectRejected(Batch({Chunk(2, {-1})}), StatusCode::kInvalidArgument,
                 "sequence 2: tokens[0] = -1 is outside the vocabulary");
  ExpectUnharmed();
}

TEST_F(ForwardValidationTest, BadParents) {
  SequenceChunk self = Chunk(1, {1, 2, 3});
  self.parents = {-1, 0, 2};
  ExpectRejected(Batch({self}), StatusCode::kInvalidArgument,
                 "sequence 1: parents[2] = 2 must be -1 or an earlier index");
  SequenceChunk later = Chunk(1, {1, 2, 3});
  later.parents = {-1, 2, 0};
  ExpectRejected(Batch({later}), StatusCode::kInvalidArgument, "parents[1] = 2");
  SequenceChunk below = Chunk(1, {1, 2});
  below.parents = {-2, 0};
  ExpectRejected(Batch({below}), StatusCode::kInvalidArgument, "parents[0] = -2");
  SequenceChunk short_parents = Chunk(1, {1, 2});
  short_parents.parents = {-1};
  ExpectRejected(Batch({short_parents}), StatusCode::kInvalidArgument,
                 "sequence 1: parents and tokens differ in length");
  ExpectUnharmed();
}

TEST_F(ForwardValidationTest, BadPositions) {
  SequenceChunk mismatch = Chunk(2, {1, 2});
  mismatch.positions = {3};
  ExpectRejected(Batch({mismatch}), StatusCode::kInvalidArgument,
                 "sequence 2: positions and tokens differ in length");
  SequenceChunk outside = Chunk(2, {1, 2});
  outside.positions = {3, 128};
  ExpectRejected(Batch({outside}), StatusCode::kInvalidArgument,
                 "sequence 2: positions[1] = 128 is outside [0, 128)");
  SequenceChunk negative = Chunk(2, {1});
  negative.positions = {-1};
  ExpectRejected(Batch({negative}), StatusCode::kInvalidArgument, "positions[0] = -1");
  ExpectUnharmed();
}

TEST_F(ForwardValidationTest, UnknownSequence) {
  ExpectRejected(Batch({Chunk(99, {1})}), StatusCode::kNotFound, "sequence 99 was not added");
  // Also when a valid sequence comes first in the batch.
  ExpectRejected(Batch({Chunk(1, {1}), Chunk(99, {1})}), StatusCode::kNotFound, "sequence 99");
  ExpectUnharmed();
}

TEST_F(ForwardValidationTest, PastTheContextLength) {
  ExpectRejected(Batch({Chunk(2, Tokens(126))}), StatusCode::kOutOfRange,
                 "sequence 2: 129 tokens exceed the context length of 128");
  ASSERT_TRUE(runner_->AddSequence(3).ok());
  auto out = runner_->Forward(Batch({Chunk(3, Tokens(129))}));
  EXPECT_EQ(out.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(out.status().message(), HasSubstr("context length of 128"));
  EXPECT_EQ(runner_->SequenceLength(3), 0);
  ASSERT_TRUE(runner_->ReleaseSequence(3).ok());
  ExpectUnharmed();
}

TEST_F(ForwardValidationTest, MalformedBatches) {
  ExpectRejected(Batch({}), StatusCode::kInvalidArgument, "batch has no sequences");
  ExpectRejected(Batch({Chunk(1, {})}), StatusCode::kInvalidArgument,
                 "sequence 1: tokens is empty");
  ExpectRejected(Batch({Chunk(1, {1}), Chunk(1, {2})}), StatusCode::kInvalidArgument,
                 "sequence 1: appears twice in one batch");
  ForwardBatch hidden = Batch({Chunk(1, {1})});
  hidden.hidden_layers = {0, 3};
  ExpectRejected(hidden, StatusCode::kInvalidArgument, "hidden_layers: index 3 outside [0, 2]");
  hidden.hidden_layers = {-1};
  ExpectRejected(hidden, StatusCode::kInvalidArgument, "hidden_layers: index -1");
  SequenceChunk rows = Chunk(1, {1, 2}, LogitsRows::kExplicit);
  rows.logit_rows = {0, 2};
  ExpectRejected(Batch({rows}), StatusCode::kInvalidArgument,
                 "sequence 1: logit row 2 outside [0, 2)");
  ExpectUnharmed();
}

TEST_F(ForwardValidationTest, OneBadSequenceRejectsTheWholeBatch) {
  ExpectRejected(Batch({Chunk(1, {seq1_[6]}), Chunk(2, {seq2_[3], 70})}),
                 StatusCode::kInvalidArgument, "sequence 2: tokens[1] = 70");
  ExpectUnharmed();
}

TEST_F(ForwardValidationTest, ContextLengthBoundary) {
  ASSERT_TRUE(runner_->AddSequence(3).ok());
  const std::vector<int32_t> full = Tokens(128, 9);
  ForwardOk(*runner_, Chunk(3, std::vector<int32_t>(full.begin(), full.end() - 1)));
  torch::Tensor last = ForwardOk(*runner_, Chunk(3, {full.back()}));
  ExpectClose(last, Row(DenseLogits(*model_, full), 127), "position 127");
  auto out = runner_->Forward(Batch({Chunk(3, {1})}));
  EXPECT_EQ(out.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(out.status().message(), HasSubstr("129 tokens exceed the context length of 128"));
  EXPECT_EQ(runner_->SequenceLength(3), 128);
  ASSERT_TRUE(runner_->ReleaseSequence(3).ok());
  ExpectUnharmed();
}

// ----------------------------------------------------------------------------------------------
// Sequence management.

TEST(ModelRunnerTest, SequenceLifecycle) {
  auto model = MakeVariedTinyModel(TinyConfig(), 2);
  auto runner = Runner(model);
  ASSERT_TRUE(runner->AddSequence(4).ok());
  EXPECT_TRUE(runner->HasSequence(4));
  EXPECT_FALSE(runner->HasSequence(5));
  EXPECT_EQ(runner->AddSequence(4).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(runner->ReleaseSequence(5).code(), StatusCode::kNotFound);
  EXPECT_EQ(runner->KeepOnly(5, 0, {}).code(), StatusCode::kNotFound);
  EXPECT_EQ(runner->Truncate(5, 0).code(), StatusCode::kNotFound);
  EXPECT_EQ(runner->kv_stats().num_sequences, 1);
  EXPECT_EQ(runner->free_kv_positions(), 64 * 4);

  // Truncate rolls back: decoding a different token afterwards is as if the first never happened.
  const std::vector<int32_t> prompt = Tokens(5);
  ForwardOk(*runner, Chunk(4, prompt));
  ForwardOk(*runner, Chunk(4, {10, 11}));
  EXPECT_EQ(runner->SequenceLength(4), 7);
  EXPECT_EQ(runner->Truncate(4, 8).code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(runner->Truncate(4, 5).ok());
  std::vector<int32_t> other = prompt;
  other.push_back(20);
  ExpectClose(ForwardOk(*runner, Chunk(4, {20})), Row(DenseLogits(*model, other), 5),
              "after truncate");
  EXPECT_EQ(runner->free_kv_positions(), (64 - 2) * 4);

  ASSERT_TRUE(runner->ReleaseSequence(4).ok());
  EXPECT_FALSE(runner->HasSequence(4));
  EXPECT_EQ(runner->SequenceLength(4), 0);
  EXPECT_EQ(runner->kv_stats().free_blocks, 64);
  // The id can be reused and starts empty.
  ASSERT_TRUE(runner->AddSequence(4).ok());
  ExpectClose(ForwardOk(*runner, Chunk(4, {other[0]})), Row(DenseLogits(*model, other), 0),
              "reused id");
}

TEST(ModelRunnerTest, LogitsRowsAndHiddenStates) {
  auto model = MakeVariedTinyModel(TinyConfig(), 3);
  auto runner = Runner(model);
  ASSERT_TRUE(runner->AddSequence(1).ok());
  const std::vector<int32_t> tokens = Tokens(6);
  const torch::Tensor dense = DenseLogits(*model, tokens);

  SequenceChunk explicit_rows = Chunk(1, tokens, LogitsRows::kExplicit);
  explicit_rows.logit_rows = {4, 1};
  ForwardBatch batch = Batch({explicit_rows});
  batch.hidden_layers = {0, 2, 1};
  auto out = runner->Forward(batch);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->logits.size(0), 2);
  ExpectClose(Row(out->logits, 0), Row(dense, 4), "explicit row 4");
  ExpectClose(Row(out->logits, 1), Row(dense, 1), "explicit row 1");
  EXPECT_EQ(out->logits_offset, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(out->token_offset, (std::vector<int64_t>{0, 6}));
  ASSERT_EQ(out->hidden.size(), 3u);
  // Layer 0 is the embeddings; L is after the final norm, whose logits are the model's.
  const auto ids = torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), torch::kLong);
  ExpectClose(out->hidden[0], model->model->embed_tokens->weight.index_select(0, ids).detach(),
              "hidden 0", 0.0);
  {
    torch::NoGradGuard no_grad;
    ExpectClose(model->Logits(out->hidden[1]), dense, "hidden L");
  }
  EXPECT_EQ(out->hidden[2].sizes(), (std::vector<int64_t>{6, 32}));
  EXPECT_GT((out->hidden[2] - out->hidden[0]).abs().max().item<double>(), 1e-3);

  ASSERT_TRUE(runner->AddSequence(2).ok());
  auto none = runner->Forward(Batch({Chunk(2, tokens, LogitsRows::kNone)}));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->logits.sizes(), (std::vector<int64_t>{0, 64}));
  EXPECT_EQ(none->logits_offset, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(runner->SequenceLength(2), 6);
}

// A draft LM's reduced head: the same logits on the kept tokens, -inf on the others, the shape
// unchanged; bad restrictions are refused naming the token; an empty one restores the full head.
TEST(ModelRunnerTest, RestrictedVocabularyKeepsTheLogitsOfItsTokens) {
  auto model = MakeVariedTinyModel(TinyConfig(), 5);
  auto runner = Runner(model);
  const std::vector<int32_t> tokens = Tokens(5);
  const torch::Tensor dense = DenseLogits(*model, tokens);
  const std::vector<int32_t> kept = {9, 0, 63, 17};
  ASSERT_TRUE(runner->RestrictVocabulary(kept).ok());
  ASSERT_TRUE(runner->AddSequence(1).ok());
  auto out = runner->Forward(Batch({Chunk(1, tokens, LogitsRows::kAll)}));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->logits.sizes(), dense.sizes());
  for (int64_t t = 0; t < 64; ++t) {
    const torch::Tensor column = out->logits.select(1, t);
    if (std::find(kept.begin(), kept.end(), t) != kept.end()) {
      ExpectClose(column, dense.select(1, t), "kept token");
    } else {
      EXPECT_TRUE(torch::isinf(column).all().item<bool>()) << t;
      EXPECT_LT(column.max().item<float>(), 0) << t;
    }
  }

  EXPECT_THAT(runner->RestrictVocabulary({3, 64}).message(),
              HasSubstr("token 1 is 64, outside [0, 64)"));
  EXPECT_THAT(runner->RestrictVocabulary({-2}).message(), HasSubstr("token 0 is -2"));
  EXPECT_THAT(runner->RestrictVocabulary({5, 7, 5}).message(), HasSubstr("token 5 is repeated"));
  // A refused restriction leaves the previous one in place.
  ASSERT_TRUE(runner->AddSequence(2).ok());
  auto still = runner->Forward(Batch({Chunk(2, tokens)}));
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_TRUE(torch::isinf(still->logits.select(1, 1)).all().item<bool>());

  ASSERT_TRUE(runner->RestrictVocabulary({}).ok());
  ASSERT_TRUE(runner->AddSequence(3).ok());
  auto full = runner->Forward(Batch({Chunk(3, tokens, LogitsRows::kAll)}));
  ASSERT_TRUE(full.ok()) << full.status();
  ExpectClose(full->logits, dense, "full head again");
}

// ----------------------------------------------------------------------------------------------
// KV cache exhaustion and reuse after free.

TEST(KvExhaustionTest, RejectsWhatDoesNotFitAndReusesFreedBlocks) {
  auto model = MakeVariedTinyModel(TinyConfig(), 31);
  auto runner = Runner(model, Options(/*num_blocks=*/4, /*block_size=*/4));
  const std::vector<int32_t> a = Tokens(10, 1), b = Tokens(8, 30), c = Tokens(4, 50);
  ASSERT_TRUE(runner->AddSequence(1).ok());
  ASSERT_TRUE(runner->AddSequence(2).ok());
  ForwardOk(*runner, Chunk(1, std::vector<int32_t>(a.begin(), a.begin() + 8)));  // 2 blocks
  ForwardOk(*runner, Chunk(2, std::vector<int32_t>(b.begin(), b.begin() + 6)));  // 2 blocks
  ASSERT_EQ(runner->kv_stats().free_blocks, 0);
  EXPECT_EQ(runner->free_kv_positions(), 0);

  auto full = runner->Forward(Batch({Chunk(1, {a[8]})}));
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(full.status().message(), "KV cache full: the batch needs 1 blocks, 0 of 4 are free");
  EXPECT_EQ(runner->SequenceLength(1), 8);

  // All or nothing across the batch: seq 2 would fit in its last block, seq 1 does not.
  full = runner->Forward(Batch({Chunk(2, {b[6]}), Chunk(1, {a[8]})}));
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(runner->SequenceLength(1), 8);
  EXPECT_EQ(runner->SequenceLength(2), 6);

  ASSERT_TRUE(runner->AddSequence(3).ok());
  full = runner->Forward(Batch({Chunk(3, {c[0]})}));
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(runner->SequenceLength(3), 0);

  // What fits still runs.
  ExpectClose(ForwardOk(*runner, Chunk(2, {b[6]})), Row(DenseLogits(*model, b), 6), "seq 2 fits");

  // Freeing seq 2 makes room: the same forwards now succeed, on blocks that still hold seq 2's
  // stale keys/values.
  ASSERT_TRUE(runner->ReleaseSequence(2).ok());
  EXPECT_EQ(runner->kv_stats().free_blocks, 2);
  EXPECT_EQ(runner->free_kv_positions(), 8);
  ExpectClose(ForwardOk(*runner, Chunk(1, {a[8]})), Row(DenseLogits(*model, a), 8), "seq 1 grows");
  ExpectClose(ForwardOk(*runner, Chunk(3, c, LogitsRows::kAll)), DenseLogits(*model, c),
              "seq 3 on reused blocks");
  EXPECT_EQ(runner->kv_stats().free_blocks, 0);
  EXPECT_EQ(runner->kv_stats().num_sequences, 2);
  // Seq 1 has room left in its third block; seq 3 filled its two.
  ExpectClose(ForwardOk(*runner, Chunk(1, {a[9]})), Row(DenseLogits(*model, a), 9), "seq 1 again");
  EXPECT_EQ(runner->Forward(Batch({Chunk(3, {1})})).status().code(),
            StatusCode::kResourceExhausted);
}

TEST(KvExhaustionTest, BatchNeedsAreSummed) {
  auto model = MakeVariedTinyModel(TinyConfig(), 32);
  auto runner = Runner(model, Options(/*num_blocks=*/4, /*block_size=*/4));
  ASSERT_TRUE(runner->AddSequence(1).ok());
  ASSERT_TRUE(runner->AddSequence(2).ok());
  ForwardOk(*runner, Chunk(1, Tokens(4)));  // fills one block
  // Each needs one block and two of the three free ones are taken.
  ForwardOk(*runner, Batch({Chunk(1, {5}), Chunk(2, {6})}));
  ASSERT_EQ(runner->kv_stats().free_blocks, 1);
  ForwardOk(*runner, Chunk(2, {1, 2, 3}));  // fills seq 2's block
  // Either chunk alone fits in the one free block; together they need two.
  auto out = runner->Forward(Batch({Chunk(1, {1, 2, 3, 4}), Chunk(2, {7})}));
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(out.status().message(), "KV cache full: the batch needs 2 blocks, 1 of 4 are free");
  EXPECT_EQ(runner->SequenceLength(1), 5);
  EXPECT_EQ(runner->SequenceLength(2), 4);
}

// ----------------------------------------------------------------------------------------------
// Ragged batches: sequences of different lengths in one forward equal each run alone.

TEST(RaggedBatchTest, BatchEqualsEachSequenceAlone) {
  auto model = MakeVariedTinyModel(TinyConfig(), 41);
  auto batched = Runner(model);
  auto alone = Runner(model);
  const std::vector<int32_t> a = Tokens(9, 2), b = Tokens(8, 20), c = Tokens(6, 44);
  for (SeqId s : {1, 2, 3}) {
    ASSERT_TRUE(batched->AddSequence(s).ok());
    ASSERT_TRUE(alone->AddSequence(s).ok());
  }
  auto part = [](const std::vector<int32_t>& v, int from, int to) {
    return std::vector<int32_t>(v.begin() + from, v.begin() + to);
  };

  // Step 1: prefills of 7, 3 and 5 tokens with different logits modes.
  const std::vector<SequenceChunk> step1 = {Chunk(1, part(a, 0, 7), LogitsRows::kAll),
                                            Chunk(2, part(b, 0, 3), LogitsRows::kLast),
                                            Chunk(3, part(c, 0, 5), LogitsRows::kNone)};
  auto out = batched->Forward(Batch(step1));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->token_offset, (std::vector<int64_t>{0, 7, 10, 15}));
  EXPECT_EQ(out->logits_offset, (std::vector<int64_t>{0, 7, 8, 8}));
  ASSERT_EQ(out->logits.size(0), 8);
  ExpectClose(out->logits.slice(0, 0, 7), ForwardOk(*alone, step1[0]), "step 1 seq 1");
  ExpectClose(out->logits.slice(0, 7, 8), ForwardOk(*alone, step1[1]), "step 1 seq 2");
  ForwardOk(*alone, step1[2]);
  ExpectClose(out->logits.slice(0, 0, 7), DenseLogits(*model, a).slice(0, 0, 7), "seq 1 dense");

  // Step 2: decode, chunked prefill and decode side by side.
  const std::vector<SequenceChunk> step2 = {
      Chunk(1, part(a, 7, 8)), Chunk(2, part(b, 3, 8), LogitsRows::kAll), Chunk(3, part(c, 5, 6))};
  out = batched->Forward(Batch(step2));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->logits_offset, (std::vector<int64_t>{0, 1, 6, 7}));
  ExpectClose(out->logits.slice(0, 0, 1), ForwardOk(*alone, step2[0]), "step 2 seq 1");
  ExpectClose(out->logits.slice(0, 1, 6), ForwardOk(*alone, step2[1]), "step 2 seq 2");
  ExpectClose(out->logits.slice(0, 6, 7), ForwardOk(*alone, step2[2]), "step 2 seq 3");
  ExpectClose(out->logits.slice(0, 1, 6), DenseLogits(*model, b).slice(0, 3, 8), "seq 2 dense");
  ExpectClose(out->logits.slice(0, 6, 7), Row(DenseLogits(*model, c), 5), "seq 3 dense");

  // Step 3: one decode each, batch order different from insertion order.
  const std::vector<SequenceChunk> step3 = {Chunk(3, {4}), Chunk(1, part(a, 8, 9)), Chunk(2, {9})};
  out = batched->Forward(Batch(step3));
  ASSERT_TRUE(out.ok()) << out.status();
  for (int i = 0; i < 3; ++i) {
    ExpectClose(out->logits.slice(0, i, i + 1), ForwardOk(*alone, step3[i]),
                "step 3 row " + std::to_string(i));
  }
  for (SeqId s : {1, 2, 3}) EXPECT_EQ(batched->SequenceLength(s), alone->SequenceLength(s));
}

}  // namespace
}  // namespace specula
