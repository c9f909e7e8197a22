// Reference parity: the engine against an independent Python implementation of Hugging Face
// semantics (tests/reference/hf_reference.py, run by Debian's /usr/bin/python3 with python3-torch).
//
// For every architecture the script writes a small random HF-layout checkpoint (config.json +
// safetensors; sharded for llama, bf16 on disk for qwen3) and the expected outputs of four
// scenarios, all computed as plain causal runs of single sequences. The engine loads the checkpoint
// with ModelRunner::Load (fp32, CPU, a paged cache of 4-token blocks so sequences span several
// blocks) and replays each scenario through ModelRunner::Forward; logits and hidden states must
// match to 1e-4.
//
//   Prefill           one 9-token prompt: logits of every position, hidden states 0..L.
//   IncrementalDecode the prompt in chunks of 4 and 5, then 3 single-token steps.
//   RaggedBatch       3 sequences of lengths 3, 7, 5 in one forward (kAll / kExplicit / kLast).
//   TreeAndCommit     a 9-node, two-root token tree after a 5-token prefix, batched with a plain
//                     causal sequence; node i must equal the causal run of prefix + path(i). Then
//                     KeepOnly commits one path and the next tokens must match the causal run of
//                     the accepted sequence (proves the KV compaction).
//
// The reference runs once per architecture (~1 s) and its outputs are cached in the build tree,
// keyed by a hash of the script. Without a /usr/bin/python3 that imports torch the tests skip.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/model/checkpoint.h"
#include "common/model/model_runner.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

constexpr double kTolerance = 1e-4;
constexpr char kPython[] = "/usr/bin/python3";  // Debian's, with python3-torch (not pyenv's)

bool PythonHasTorch() {
  return std::system((std::string(kPython) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> ToI32(const at::Tensor& t) {
  at::Tensor c = t.to(torch::kInt).contiguous();
  return std::vector<int32_t>(c.data_ptr<int32_t>(), c.data_ptr<int32_t>() + c.numel());
}

std::vector<int64_t> ToI64(const at::Tensor& t) {
  at::Tensor c = t.to(torch::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// Max |actual - expected| (both as float32); a shape mismatch is a failure.
void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << ": engine returned no tensor";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double diff =
      (actual.to(torch::kFloat) - expected.to(torch::kFloat)).abs().max().item<double>();
  EXPECT_LT(diff, kTolerance) << what << ": max |diff| = " << diff;
  std::cout << "  [parity] " << what << ": max |diff| = " << diff << "\n";
}

class ReferenceParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string arch = GetParam();
    fs::path dir;
    bool no_torch = false;
    ASSERT_NO_FATAL_FAILURE(Generate(arch, &dir, &no_torch));
    if (no_torch) {
      GTEST_SKIP() << kPython << " cannot import torch: install Debian's python3-torch to run the "
                   << "reference-parity tests";
    }
    auto cases = LoadSafetensorsFile((dir / "cases.safetensors").string());
    ASSERT_TRUE(cases.ok()) << cases.status();
    cases_ = std::move(*cases);

    ModelRunnerOptions options;  // float32 on CPU
    options.kv.block_size = 4;   // sequences here span several blocks
    options.kv.num_blocks = 64;
    auto runner = ModelRunner::Load((dir / "model").string(), options);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = std::move(*runner);
    hidden_layers_ = ToI64(Case("hidden_layers"));
  }

  // The reference's outputs for `arch`, generated on first use. They are cached in the build tree
  // under a name that hashes the script, so the CTest processes (one per test) share one run per
  // architecture and an edited script regenerates. Concurrent processes each generate into a
  // private directory and rename it into place; the first rename wins, the others use it.
  static void Generate(const std::string& arch, fs::path* dir, bool* no_torch) {
    const fs::path script = fs::path(SPECULA_SOURCE_DIR) / "tests/reference/hf_reference.py";
    const std::string source = ReadText(script);
    ASSERT_FALSE(source.empty()) << "cannot read " << script;
    std::error_code ec;
    fs::path cache = fs::path(SPECULA_BINARY_DIR) / "tests" / "reference_parity";
    fs::create_directories(cache, ec);
    if (ec) {
      cache = fs::temp_directory_path() / "specula_reference_parity";
      fs::create_directories(cache, ec);
      ASSERT_FALSE(ec) << "cannot create " << cache << ": " << ec.message();
    }
    std::ostringstream name;
    name << arch << "-" << std::hex << std::hash<std::string>()(source);
    *dir = cache / name.str();
    if (fs::exists(*dir / "cases.safetensors")) return;
    if (!PythonHasTorch()) {
      *no_torch = true;
      return;
    }

    std::string tmpl = (cache / (name.str() + ".tmp-XXXXXX")).string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << "mkdtemp in " << cache << " failed";
    const fs::path tmp = tmpl;
    const fs::path log = tmp / "reference.log";
    const std::string cmd = std::string(kPython) + " '" + script.string() + "' --out '" +
                            tmp.string() + "' --arch " + arch + " >'" + log.string() + "' 2>&1";
    const int rc = std::system(cmd.c_str());
    const std::string output = ReadText(log);
    if (rc != 0) fs::remove_all(tmp, ec);
    ASSERT_EQ(rc, 0) << cmd << "\n" << output;
    std::cout << "  [reference] " << output;
    fs::rename(tmp, *dir, ec);
    if (ec) fs::remove_all(tmp, ec);  // another process got there first
    ASSERT_TRUE(fs::exists(*dir / "cases.safetensors")) << "no reference outputs in " << *dir;
  }

  at::Tensor Case(const std::string& name) const {
    auto it = cases_.find(name);
    if (it == cases_.end()) {
      ADD_FAILURE() << "cases.safetensors has no tensor '" << name << "'";
      return at::Tensor();
    }
    return it->second;
  }

  // Forward that must succeed.
  ForwardOutput Run(const ForwardBatch& batch) {
    auto out = runner_->Forward(batch);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? std::move(*out) : ForwardOutput{};
  }

  // The engine's hidden states of rows [begin, end) vs expected [K, rows, d].
  void ExpectHidden(const ForwardOutput& out, int64_t begin, int64_t end,
                    const at::Tensor& expected, const std::string& what) {
    ASSERT_EQ(out.hidden.size(), hidden_layers_.size()) << what;
    for (size_t k = 0; k < hidden_layers_.size(); ++k) {
      ExpectClose(out.hidden[k].slice(0, begin, end), expected[static_cast<int64_t>(k)],
                  what + " hidden[" + std::to_string(hidden_layers_[k]) + "]");
    }
  }

  SequenceChunk Chunk(SeqId seq, const at::Tensor& tokens, LogitsRows rows = LogitsRows::kAll) {
    SequenceChunk c;
    c.seq = seq;
    c.tokens = ToI32(tokens);
    c.logits = rows;
    return c;
  }

  std::map<std::string, at::Tensor> cases_;
  std::unique_ptr<ModelRunner> runner_;
  std::vector<int64_t> hidden_layers_;
};

TEST_P(ReferenceParityTest, Prefill) {
  const at::Tensor tokens = Case("prefill/tokens");
  ASSERT_TRUE(runner_->AddSequence(1).ok());
  ForwardBatch batch;
  batch.seqs.push_back(Chunk(1, tokens));
  batch.hidden_layers = hidden_layers_;
  ForwardOutput out = Run(batch);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(out.logits_offset, (std::vector<int64_t>{0, tokens.numel()}));
  EXPECT_EQ(out.token_offset, (std::vector<int64_t>{0, tokens.numel()}));
  ExpectClose(out.logits, Case("prefill/logits"), "prefill logits");
  ExpectHidden(out, 0, tokens.numel(), Case("prefill/hidden"), "prefill");
  EXPECT_EQ(runner_->SequenceLength(1), tokens.numel());
}

TEST_P(ReferenceParityTest, IncrementalDecode) {
  const at::Tensor tokens = Case("decode/tokens");
  const at::Tensor logits = Case("decode/logits");
  const at::Tensor hidden = Case("decode/hidden");
  ASSERT_TRUE(runner_->AddSequence(7).ok());
  int64_t start = 0;
  for (int64_t n : ToI64(Case("decode/chunks"))) {
    ForwardBatch batch;
    batch.seqs.push_back(Chunk(7, tokens.slice(0, start, start + n)));
    if (start == 4) {  // spell out the default positions once: the field must mean the same
      for (int64_t i = 0; i < n; ++i)
        batch.seqs[0].positions.push_back(static_cast<int32_t>(start + i));
    }
    batch.hidden_layers = hidden_layers_;
    ForwardOutput out = Run(batch);
    ASSERT_FALSE(HasFailure());
    const std::string what =
        "decode rows [" + std::to_string(start) + ", " + std::to_string(start + n) + ")";
    ExpectClose(out.logits, logits.slice(0, start, start + n), what + " logits");
    ExpectHidden(out, 0, n, hidden.slice(1, start, start + n), what);
    start += n;
    EXPECT_EQ(runner_->SequenceLength(7), start);
  }
  EXPECT_EQ(start, tokens.numel());
}

TEST_P(ReferenceParityTest, RaggedBatch) {
  const std::vector<int64_t> lens = ToI64(Case("ragged/lengths"));
  ASSERT_EQ(lens.size(), 3u);
  const at::Tensor tokens = Case("ragged/tokens");
  const at::Tensor logits = Case("ragged/logits");
  // Sequence 0: every row; sequence 1: rows 2 and 6; sequence 2: the last row.
  const std::vector<int32_t> explicit_rows = {2, 6};
  const LogitsRows modes[3] = {LogitsRows::kAll, LogitsRows::kExplicit, LogitsRows::kLast};
  ForwardBatch batch;
  std::vector<int64_t> starts = {0};
  for (size_t b = 0; b < lens.size(); ++b) {
    ASSERT_TRUE(runner_->AddSequence(100 + static_cast<SeqId>(b)).ok());
    batch.seqs.push_back(Chunk(100 + static_cast<SeqId>(b),
                               tokens.slice(0, starts[b], starts[b] + lens[b]), modes[b]));
    starts.push_back(starts[b] + lens[b]);
  }
  batch.seqs[1].logit_rows = explicit_rows;
  batch.hidden_layers = hidden_layers_;
  ForwardOutput out = Run(batch);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(out.token_offset, starts);
  EXPECT_EQ(out.logits_offset, (std::vector<int64_t>{0, lens[0], lens[0] + 2, lens[0] + 3}));
  std::vector<int64_t> expected_rows;
  for (int64_t i = 0; i < lens[0]; ++i) expected_rows.push_back(i);
  for (int32_t r : explicit_rows) expected_rows.push_back(starts[1] + r);
  expected_rows.push_back(starts[3] - 1);
  ExpectClose(out.logits, logits.index_select(0, torch::tensor(expected_rows)), "ragged logits");
  ExpectHidden(out, 0, starts[3], Case("ragged/hidden"), "ragged");
}

TEST_P(ReferenceParityTest, TreeAndCommit) {
  const at::Tensor prefix = Case("tree/prefix");
  const at::Tensor side = Case("tree/side_tokens");
  const at::Tensor side_logits = Case("tree/side_logits");
  const int64_t split = ToI64(Case("tree/side_split"))[0];
  const int64_t prefix_len = prefix.numel();
  constexpr SeqId kTree = 11, kSide = 12;
  ASSERT_TRUE(runner_->AddSequence(kTree).ok());
  ASSERT_TRUE(runner_->AddSequence(kSide).ok());

  // Forward 1: the prefix, next to the side sequence's first tokens.
  {
    ForwardBatch batch;
    batch.seqs.push_back(Chunk(kTree, prefix));
    batch.seqs.push_back(Chunk(kSide, side.slice(0, 0, split)));
    ForwardOutput out = Run(batch);
    ASSERT_FALSE(HasFailure());
    ExpectClose(out.logits.slice(0, 0, prefix_len), Case("tree/prefix_logits"),
                "tree prefix logits");
    ExpectClose(out.logits.slice(0, prefix_len), side_logits.slice(0, 0, split), "side logits (1)");
  }

  // Forward 2: the token tree (positions = prefix_len + depth), next to a plain causal chunk.
  const at::Tensor tree = Case("tree/tokens");
  const int64_t nodes = tree.numel();
  {
    ForwardBatch batch;
    SequenceChunk chunk = Chunk(kTree, tree);
    chunk.parents = ToI32(Case("tree/parents"));
    chunk.positions = ToI32(Case("tree/positions"));
    batch.seqs.push_back(chunk);
    batch.seqs.push_back(Chunk(kSide, side.slice(0, split)));
    batch.hidden_layers = hidden_layers_;
    ForwardOutput out = Run(batch);
    ASSERT_FALSE(HasFailure());
    ExpectClose(out.logits.slice(0, 0, nodes), Case("tree/logits"), "tree logits");
    ExpectHidden(out, 0, nodes, Case("tree/hidden"), "tree");
    ExpectClose(out.logits.slice(0, nodes), side_logits.slice(0, split), "side logits (2)");
    EXPECT_EQ(runner_->SequenceLength(kTree), prefix_len + nodes);
  }

  // Commit the accepted path; the next tokens must see exactly prefix + path in the cache.
  const std::vector<int64_t> accept = ToI64(Case("tree/accept"));
  Status kept = runner_->KeepOnly(kTree, prefix_len, accept);
  ASSERT_TRUE(kept.ok()) << kept;
  EXPECT_EQ(runner_->SequenceLength(kTree), prefix_len + static_cast<int64_t>(accept.size()));
  {
    ForwardBatch batch;
    batch.seqs.push_back(Chunk(kTree, Case("tree/next_tokens")));
    ForwardOutput out = Run(batch);
    ASSERT_FALSE(HasFailure());
    ExpectClose(out.logits, Case("tree/next_logits"), "after KeepOnly logits");
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ReferenceParityTest,
                         ::testing::Values("llama", "qwen2", "qwen3", "mistral", "llama3"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace specula
