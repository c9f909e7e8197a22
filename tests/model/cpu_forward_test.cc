#include "common/model/cpu_forward.h"

#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "common/model/cpu_kernels.h"
#include "common/model/model_runner.h"
#include "common/model/transformer.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

std::unique_ptr<ModelRunner> Runner(const ModelConfig& config, bool cpu_forward,
                                    DraftMatmul draft_matmul = DraftMatmul::kFloat32) {
  ModelRunnerOptions options;
  options.kv.block_size = 4;
  options.kv.num_blocks = 64;
  options.cpu_forward = cpu_forward;
  options.draft_matmul = draft_matmul;
  auto runner = ModelRunner::FromModule(MakeVariedTinyModel(config, 7), options);
  EXPECT_TRUE(runner.ok()) << runner.status().ToString();
  return std::move(runner).value();
}

// LibTorch ops dispatched on this thread while it lives.
class OpCount {
 public:
  OpCount() {
    handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(
        [](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
          ++count_;
          return nullptr;
        }));
  }
  ~OpCount() { at::removeCallback(handle_); }
  int64_t count() const { return count_; }

 private:
  static inline thread_local int64_t count_ = 0;
  at::CallbackHandle handle_;
};

// The same forwards through CpuForward and through the module: logits, hidden states and the
// KV caches written must be bitwise equal (the same kernels in the same order on the same data).
void ExpectSameForwards(const ModelConfig& config) {
  auto fast = Runner(config, /*cpu_forward=*/true);
  auto reference = Runner(config, /*cpu_forward=*/false);
  ASSERT_TRUE(fast && reference);
  const int64_t L = config.num_hidden_layers;
  // A prompt chunk, a decode step, a tree with explicit positions, a batch of three with a
  // restricted head, and a chunk too long for CpuForward (both take the module's path).
  std::vector<ForwardBatch> steps;
  SequenceChunk prompt{.seq = 1, .logits = LogitsRows::kAll};
  for (int i = 0; i < 20; ++i) prompt.tokens.push_back((i * 7 + 3) % config.vocab_size);
  steps.push_back({.seqs = {prompt}, .hidden_layers = {0, 1, L}});
  steps.push_back({.seqs = {{.seq = 1, .tokens = {5}}}});
  steps.push_back({.seqs = {{.seq = 1,
                             .tokens = {9, 4, 11, 2, 30, 8},
                             .positions = {21, 22, 22, 23, 23, 24},
                             .parents = {-1, 0, 0, 1, 2, 3},
                             .logits = LogitsRows::kExplicit,
                             .logit_rows = {0, 3, 5}}},
                   .hidden_layers = {L}});
  steps.push_back({.seqs = {{.seq = 1, .tokens = {17}},
                            {.seq = 2, .tokens = {1, 2, 3, 4, 5, 6, 7}, .logits = LogitsRows::kAll},
                            {.seq = 3, .tokens = {40, 41}, .logits = LogitsRows::kNone}},
                   .hidden_layers = {1}});
  SequenceChunk long_chunk{.seq = 3};
  for (int i = 0; i < 40; ++i) long_chunk.tokens.push_back((i * 5 + 1) % config.vocab_size);
  steps.push_back({.seqs = {long_chunk}});
  steps.push_back({.seqs = {{.seq = 2, .tokens = {12}}, {.seq = 3, .tokens = {13}}}});
  for (SeqId s : {1, 2, 3}) {
    ASSERT_TRUE(fast->AddSequence(s).ok());
    ASSERT_TRUE(reference->AddSequence(s).ok());
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i == 3) {  // a draft LM's reduced head from here on
      std::vector<int32_t> vocabulary;
      for (int32_t t = 0; t < config.vocab_size; t += 3) vocabulary.push_back(t);
      ASSERT_TRUE(fast->RestrictVocabulary(vocabulary).ok());
      ASSERT_TRUE(reference->RestrictVocabulary(vocabulary).ok());
    }
    int64_t rows = 0;
    for (const SequenceChunk& s : steps[i].seqs) rows += static_cast<int64_t>(s.tokens.size());
    EXPECT_EQ(CpuForward(config).Applies(*fast->module(), rows), rows <= kSmallMatmulMaxRows);
    auto a = fast->Forward(steps[i]);
    auto b = reference->Forward(steps[i]);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_TRUE(torch::equal(a->logits, b->logits)) << "step " << i;
    EXPECT_EQ(a->logits_offset, b->logits_offset);
    ASSERT_EQ(a->hidden.size(), b->hidden.size());
    for (size_t h = 0; h < a->hidden.size(); ++h) {
      EXPECT_TRUE(torch::equal(a->hidden[h], b->hidden[h])) << "step " << i << " hidden " << h;
    }
    // Every cached position (slots no sequence holds are uninitialised memory).
    const BlockAllocator& alloc = fast->kv_cache().allocator();
    for (SeqId s : {1, 2, 3}) {
      ASSERT_EQ(alloc.Length(s), reference->kv_cache().allocator().Length(s));
      ASSERT_EQ(alloc.BlockTable(s), reference->kv_cache().allocator().BlockTable(s));
      for (int64_t pos = 0; pos < alloc.Length(s); ++pos) {
        const int64_t slot = alloc.BlockTable(s)[pos / alloc.block_size()] * alloc.block_size() +
                             pos % alloc.block_size();
        for (int64_t l = 0; l < L; ++l) {
          EXPECT_TRUE(
              torch::equal(fast->kv_cache().keys(l)[slot], reference->kv_cache().keys(l)[slot]))
              << "step " << i << " sequence " << s << " position " << pos;
          EXPECT_TRUE(
              torch::equal(fast->kv_cache().values(l)[slot], reference->kv_cache().values(l)[slot]))
              << "step " << i << " sequence " << s << " position " << pos;
        }
      }
    }
  }
}

TEST(CpuForwardTest, MatchesTheModulesForwardBitwise) { ExpectSameForwards(TinyModelConfig()); }

TEST(CpuForwardTest, MatchesWithBiasesAndTiedEmbeddings) {
  ModelConfig config = TinyModelConfig();
  config.qkv_bias = true;  // Qwen2
  config.o_bias = true;
  config.tie_word_embeddings = true;
  ExpectSameForwards(config);
}

TEST(CpuForwardTest, MatchesWithQkNormAndASlidingWindow) {
  ModelConfig config = TinyModelConfig();
  config.qk_norm = true;  // Qwen3
  config.sliding_window = 6;
  ExpectSameForwards(config);
}

// The point of it: a forward of a few rows dispatches almost no LibTorch ops.
TEST(CpuForwardTest, ADecodeStepDispatchesAlmostNoLibTorchOps) {
  const ModelConfig config = TinyModelConfig();
  auto fast = Runner(config, true);
  auto reference = Runner(config, false);
  ASSERT_TRUE(fast && reference);
  ASSERT_TRUE(fast->AddSequence(1).ok() && reference->AddSequence(1).ok());
  const ForwardBatch step{.seqs = {{.seq = 1, .tokens = {3, 4}}}};
  ASSERT_TRUE(fast->Forward(step).ok() && reference->Forward(step).ok());  // scratch allocated
  int64_t fast_ops = 0, reference_ops = 0;
  {
    OpCount count;
    ASSERT_TRUE(fast->Forward({.seqs = {{.seq = 1, .tokens = {5}}}}).ok());
    fast_ops = count.count();
  }
  {
    OpCount count;
    ASSERT_TRUE(reference->Forward({.seqs = {{.seq = 1, .tokens = {5}}}}).ok());
    reference_ops = count.count() - fast_ops;
  }
  EXPECT_LE(fast_ops, 4);
  EXPECT_GT(reference_ops, 40);
}

// A draft LM's bfloat16 or int8 matmuls: close to the float32 model (bfloat16 rounding of
// weights and inputs, or int8 weights scaled per output; float32 sums), not equal to it, and a
// weight changed in place is read again.
void ExpectCopiesStayCloseAndFollowWeightUpdates(DraftMatmul matmul) {
  const ModelConfig config = TinyModelConfig();
  auto bf16 = Runner(config, /*cpu_forward=*/true, matmul);
  ASSERT_EQ(bf16->draft_matmul(), matmul);
  auto reference = Runner(config, /*cpu_forward=*/true);
  ASSERT_TRUE(bf16 && reference);
  SequenceChunk prompt{.seq = 1, .logits = LogitsRows::kAll};
  for (int i = 0; i < 12; ++i) prompt.tokens.push_back((i * 7 + 3) % config.vocab_size);
  const std::vector<ForwardBatch> steps = {{.seqs = {prompt}},
                                           {.seqs = {{.seq = 1, .tokens = {5}}}},
                                           {.seqs = {{.seq = 1, .tokens = {9, 4, 11}}}}};
  ASSERT_TRUE(bf16->AddSequence(1).ok() && reference->AddSequence(1).ok());
  for (size_t i = 0; i < steps.size(); ++i) {
    auto a = bf16->Forward(steps[i]);
    auto b = reference->Forward(steps[i]);
    ASSERT_TRUE(a.ok() && b.ok());
    const double scale = b->logits.abs().max().item<double>();
    const double diff = (a->logits - b->logits).abs().max().item<double>();
    EXPECT_LT(diff, 0.05 * scale) << "step " << i;
    EXPECT_GT(diff, 0.0) << "step " << i << ": the " << DraftMatmulName(matmul)
                         << " path did not run";
  }
  // The head scaled in place (a new version), then given new storage: each time the copy is
  // made again, so the next forward agrees with the float32 model to the same tolerance (a stale
  // head would leave the logits at the old scale, 1.5x or 3x off).
  const std::vector<ForwardBatch> next = {{.seqs = {{.seq = 1, .tokens = {2}}}},
                                          {.seqs = {{.seq = 1, .tokens = {6}}}}};
  for (int change = 0; change < 2; ++change) {
    for (auto* runner : {bf16.get(), reference.get()}) {
      torch::NoGradGuard no_grad;
      const torch::Tensor& head = runner->module()->lm_head_weight();
      if (change == 0) {
        head.mul_(1.5);
      } else {
        torch::Tensor copy = head * 2;
        const_cast<torch::Tensor&>(head).set_data(copy);
      }
    }
    auto a = bf16->Forward(next[change]);
    auto b = reference->Forward(next[change]);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_LT((a->logits - b->logits).abs().max().item<double>(),
              0.05 * b->logits.abs().max().item<double>())
        << "change " << change;
  }
}

TEST(CpuForwardTest, Bf16WeightsStayCloseAndFollowWeightUpdates) {
  if (!Bf16MatmulRuns()) GTEST_SKIP() << "no AVX512-BF16 on this CPU or build";
  ExpectCopiesStayCloseAndFollowWeightUpdates(DraftMatmul::kBfloat16);
}

TEST(CpuForwardTest, Int8WeightsStayCloseAndFollowWeightUpdates) {
  if (!Int8MatmulRuns()) GTEST_SKIP() << "no AVX-512 on this CPU or build";
  ExpectCopiesStayCloseAndFollowWeightUpdates(DraftMatmul::kInt8);
}

// Where the CPU has not got a product, the runner says it multiplies in float32.
TEST(CpuForwardTest, AProductTheCpuLacksIsReportedAsFloat32) {
  const ModelConfig config = TinyModelConfig();
  EXPECT_EQ(Runner(config, true, DraftMatmul::kInt8)->draft_matmul(),
            Int8MatmulRuns() ? DraftMatmul::kInt8 : DraftMatmul::kFloat32);
  EXPECT_EQ(Runner(config, true, DraftMatmul::kBfloat16)->draft_matmul(),
            Bf16MatmulRuns() ? DraftMatmul::kBfloat16 : DraftMatmul::kFloat32);
  EXPECT_EQ(Runner(config, false, DraftMatmul::kInt8)->draft_matmul(), DraftMatmul::kFloat32);
}

// The packed copies are what the matmuls read, and they stay the weights: bitwise the product of
// the weights themselves (SmallMatmulRaw) at 1-9 rows, again after the weight is changed in place
// (a new version) and after it is given new storage; a write the copy cannot see (straight into
// the storage: no new version) leaves it stale until UsePackedWeights drops the copies.
TEST(CpuForwardTest, PackedWeightsAreTheWeightsAndFollowUpdates) {
  if (!PackedMatmulRuns()) GTEST_SKIP() << "no AVX-512 on this CPU or build";
  torch::manual_seed(6);
  CpuForward forward(TinyModelConfig());
  ASSERT_TRUE(forward.packed_weights());
  const int64_t n = 64, k = 48;
  torch::Tensor w = torch::randn({n, k});
  auto x = torch::randn({9, k});
  auto product = [&](int64_t rows, bool packed) {
    at::Tensor y = torch::empty({rows, n});
    if (packed) {
      forward.Matmul(x.data_ptr<float>(), rows, k, w, n, nullptr, nullptr, y.data_ptr<float>());
    } else {
      SmallMatmulRaw(x.data_ptr<float>(), rows, k, w.data_ptr<float>(), n, nullptr, nullptr,
                     y.data_ptr<float>());
    }
    return y;
  };
  auto expect_same = [&](const char* when) {
    for (int64_t rows = 1; rows <= 9; ++rows) {
      EXPECT_TRUE(torch::equal(product(rows, true), product(rows, false)))
          << when << ", " << rows << " rows";
    }
  };
  expect_same("first use");
  w.mul_(1.5);
  expect_same("scaled in place");
  w.set_data(w * 2);
  expect_same("new storage");
  w.data_ptr<float>()[0] += 1.0f;  // not seen: the copy still has the old value
  EXPECT_FALSE(torch::equal(product(1, true), product(1, false)));
  forward.UsePackedWeights(true);  // drops the copies
  expect_same("copies dropped");
  forward.UsePackedWeights(false);
  EXPECT_FALSE(forward.packed_weights());
  expect_same("packing off");
}

// More rows than the kernels take at once (a Beagle frontier at batch 16, a drafter's catch-up):
// the product of each row, with its bias and residual row, as the plain kernel's on its own.
TEST(CpuForwardTest, ProductsOfManyRowsRunInBlocks) {
  torch::manual_seed(8);
  CpuForward forward(TinyModelConfig());
  const int64_t n = 48, k = 32, rows = 2 * kSmallMatmulMaxRows + 5;
  torch::Tensor w = torch::randn({n, k}), bias = torch::randn({n});
  auto x = torch::randn({rows, k}), residual = torch::randn({rows, n});
  at::Tensor got = torch::empty({rows, n});
  forward.Matmul(x.data_ptr<float>(), rows, k, w, n, bias.data_ptr<float>(),
                 residual.data_ptr<float>(), got.data_ptr<float>());
  for (int64_t r = 0; r < rows; ++r) {
    at::Tensor want = torch::empty({1, n});
    SmallMatmulRaw(x[r].data_ptr<float>(), 1, k, w.data_ptr<float>(), n, bias.data_ptr<float>(),
                   residual[r].data_ptr<float>(), want.data_ptr<float>());
    ASSERT_TRUE(torch::allclose(got[r], want[0], 1e-5, 1e-5)) << "row " << r;
  }
}

// A product with the first n rows of a longer weight (SpecFormer's positional FFN gives the slots
// a step wants): bitwise the plain kernel's for each n, from one packed copy of every row; a
// weight whose rows are not whole groups of 16 is read as it is.
TEST(CpuForwardTest, PackedWeightsServeProductsWithTheFirstRows) {
  if (!PackedMatmulRuns()) GTEST_SKIP() << "no AVX-512 on this CPU or build";
  torch::manual_seed(7);
  CpuForward forward(TinyModelConfig());
  const int64_t k = 32;
  auto x = torch::randn({3, k});
  for (int64_t all_rows : {96, 70}) {
    torch::Tensor w = torch::randn({all_rows, k});
    for (int64_t n : {16, 32, 64}) {
      at::Tensor got = torch::empty({3, n}), want = torch::empty({3, n});
      forward.Matmul(x.data_ptr<float>(), 3, k, w, n, nullptr, nullptr, got.data_ptr<float>());
      SmallMatmulRaw(x.data_ptr<float>(), 3, k, w.data_ptr<float>(), n, nullptr, nullptr,
                     want.data_ptr<float>());
      EXPECT_TRUE(torch::equal(got, want)) << all_rows << " rows, first " << n;
    }
  }
}

TEST(CpuForwardTest, AppliesOnlyToFusedFloat32WeightsAndFewRows) {
  const ModelConfig config = TinyModelConfig();
  auto module = MakeVariedTinyModel(config, 3);
  CpuForward forward(config);
  EXPECT_FALSE(forward.Applies(*module, 1)) << "projections not fused";
  module->FuseForServing();
  EXPECT_TRUE(forward.Applies(*module, 1));
  EXPECT_TRUE(forward.Applies(*module, kSmallMatmulMaxRows));
  EXPECT_FALSE(forward.Applies(*module, 0));
  EXPECT_FALSE(forward.Applies(*module, kSmallMatmulMaxRows + 1));
  module->to(torch::kDouble);  // moving a module un-fuses it, and float64 is not the kernels'
  EXPECT_FALSE(forward.Applies(*module, 1));
}

}  // namespace
}  // namespace specula
