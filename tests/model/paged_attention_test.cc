// The in-place paged attention (CPU kernel, and the padded LibTorch fallback) against
// MaskedAttention over keys gathered by a reference that derives every row's visible positions from
// the forward's semantics directly (not from PagedAttentionLayout): ragged batches, token trees,
// GQA, block boundaries, sliding windows, contexts 1..512.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "common/kv/block_allocator.h"
#include "common/model/cpu_kernels.h"
#include "common/model/cpu_runtime.h"
#include "common/model/paged_attention.h"
#include "common/model/paged_attention_layout.h"
#include "common/model/rope.h"
#include "common/model/transformer.h"
#include "tests/testing/test_device.h"

namespace specula {
namespace {

struct SeqSpec {
  int64_t cached = 0;
  int64_t num_new = 1;
  std::vector<int32_t> parents;    // empty = chain
  std::vector<int32_t> positions;  // empty = cached + i
};

struct Case {
  int64_t nh = 8, nkv = 4, hd = 32, block_size = 16, window = 0;
  std::vector<SeqSpec> seqs;
  // q, k and v as three tensors with their own storage that lie back to back in memory (what the
  // CUDA caching allocator does with three small projections): not one fused projection.
  bool adjacent_storages = false;
};

// Visible cache positions of new row i of `s`, straight from the definition.
std::vector<int64_t> ReferenceVisible(const SeqSpec& s, int64_t i, int64_t window) {
  auto pos_of = [&](int64_t a) -> int64_t {
    return s.positions.empty() ? s.cached + a : s.positions[a];
  };
  const int64_t p = pos_of(i);
  std::vector<int64_t> visible;
  for (int64_t j = 0; j < s.cached; ++j) {
    if (window == 0 || p - j < window) visible.push_back(j);
  }
  for (int64_t a = 0; a <= i; ++a) {
    bool ancestor = s.parents.empty();
    for (int64_t x = i; !ancestor && x >= 0; x = s.parents[x]) ancestor = (x == a);
    if (ancestor && (window == 0 || p - pos_of(a) < window)) visible.push_back(s.cached + a);
  }
  return visible;
}

class PagedAttentionTest : public ::testing::Test {
 protected:
  // Runs `c` through the kernel (or the padded fallback) and through the reference; returns the
  // largest absolute difference.
  double MaxError(const Case& c, bool padded, uint64_t seed) {
    torch::manual_seed(seed);
    int64_t total_positions = 0;
    for (const SeqSpec& s : c.seqs) total_positions += s.cached + s.num_new;
    const int64_t num_blocks = total_positions / c.block_size + c.seqs.size() + 4;
    BlockAllocator alloc(num_blocks, c.block_size);
    auto key_cache = torch::randn({num_blocks * c.block_size, c.nkv, c.hd});
    auto value_cache = torch::randn({num_blocks * c.block_size, c.nkv, c.hd});
    // Interleave the sequences' growth so that their blocks are scattered through the cache.
    std::vector<SeqId> ids;
    for (size_t b = 0; b < c.seqs.size(); ++b) {
      ids.push_back(static_cast<SeqId>(b + 1));
      EXPECT_TRUE(alloc.AddSequence(ids.back()).ok());
    }
    for (int64_t step = 0;; ++step) {
      bool grew = false;
      for (size_t b = 0; b < c.seqs.size(); ++b) {
        const int64_t want = std::min<int64_t>(c.seqs[b].cached, (step + 1) * 7);
        const int64_t have = alloc.Length(ids[b]);
        if (want > have) {
          EXPECT_TRUE(alloc.Append(ids[b], want - have).ok());
          grew = true;
        }
      }
      if (!grew) break;
    }
    PagedAttentionLayout layout(c.block_size, c.window);
    int64_t N = 0;
    for (size_t b = 0; b < c.seqs.size(); ++b) {
      EXPECT_TRUE(alloc.Append(ids[b], c.seqs[b].num_new).ok());
      layout.AddSequence(alloc.BlockTable(ids[b]), c.seqs[b].cached, c.seqs[b].num_new,
                         c.seqs[b].positions, c.seqs[b].parents);
      N += c.seqs[b].num_new;
    }
    EXPECT_EQ(layout.num_rows(), N);
    // Odd seeds: q, k and v as adjacent heads of one fused projection (the serving layout, which
    // the padded path rotates in one go); even seeds: three separate tensors.
    torch::Tensor q, k, v;
    std::vector<float> back_to_back;  // owns the adjacent_storages case's memory
    if (c.adjacent_storages) {
      back_to_back.resize(N * (c.nh + 2 * c.nkv) * c.hd);
      const auto filled = torch::randn({static_cast<int64_t>(back_to_back.size())});
      std::copy_n(filled.data_ptr<float>(), back_to_back.size(), back_to_back.data());
      float* p = back_to_back.data();
      q = torch::from_blob(p, {N, c.nh, c.hd});
      k = torch::from_blob(p + N * c.nh * c.hd, {N, c.nkv, c.hd});
      v = torch::from_blob(p + N * (c.nh + c.nkv) * c.hd, {N, c.nkv, c.hd});
    } else if (seed % 2) {
      auto qkv = torch::randn({N, c.nh + 2 * c.nkv, c.hd});
      q = qkv.narrow(1, 0, c.nh);
      k = qkv.narrow(1, c.nh, c.nkv);
      v = qkv.narrow(1, c.nh + c.nkv, c.nkv);
    } else {
      q = torch::randn({N, c.nh, c.hd});
      k = torch::randn({N, c.nkv, c.hd});
      v = torch::randn({N, c.nkv, c.hd});
    }
    std::vector<int64_t> pos = layout.positions();
    auto pos_t = torch::tensor(pos, torch::kLong);
    ModelConfig config;
    config.head_dim = c.hd;
    config.rope_theta = 10000.0;
    auto [cos, sin] = RopeCosSin(RopeInverseFrequencies(config, torch::kCPU), pos_t, torch::kFloat);

    // Reference: rotate, write, then per row MaskedAttention over exactly its visible keys.
    auto ref_keys = key_cache.clone(), ref_values = value_cache.clone();
    auto q_rot = ApplyRope(q, cos, sin), k_rot = ApplyRope(k, cos, sin);
    std::vector<torch::Tensor> ref_rows;
    int64_t row = 0;
    for (size_t b = 0; b < c.seqs.size(); ++b) {
      for (int64_t i = 0; i < c.seqs[b].num_new; ++i, ++row) {
        const int64_t slot = alloc.SlotOf(ids[b], c.seqs[b].cached + i);
        ref_keys[slot] = k_rot[row];
        ref_values[slot] = v[row];
      }
    }
    row = 0;
    for (size_t b = 0; b < c.seqs.size(); ++b) {
      for (int64_t i = 0; i < c.seqs[b].num_new; ++i, ++row) {
        std::vector<int64_t> slots;
        for (int64_t p : ReferenceVisible(c.seqs[b], i, c.window)) {
          slots.push_back(alloc.SlotOf(ids[b], p));
        }
        auto index = torch::tensor(slots, torch::kLong);
        const int64_t T = static_cast<int64_t>(slots.size());
        auto keys = ref_keys.index_select(0, index).view({1, T, c.nkv, c.hd});
        auto values = ref_values.index_select(0, index).view({1, T, c.nkv, c.hd});
        auto mask = torch::ones({1, 1, 1, 1, T}, torch::kBool);
        ref_rows.push_back(
            MaskedAttention(q_rot[row].view({1, 1, c.nh, c.hd}), keys, values, mask).view({-1}));
      }
    }
    auto reference = torch::stack(ref_rows, 0);

    if (padded && !TestDevice().is_cpu()) {
      // The padded LibTorch path where it really runs: on the test device (a GPU), which
      // MakePagedInputs lays out padded by itself.
      const c10::Device device = TestDevice();
      auto dev_keys = key_cache.to(device), dev_values = value_cache.to(device);
      AttentionInputs in = MakePagedInputs(layout, cos.to(device), sin.to(device));
      EXPECT_TRUE(in.padded());
      auto out =
          PagedSelfAttention(q.to(device), k.to(device), v.to(device), in, dev_keys, dev_values)
              .cpu();
      EXPECT_EQ(out.sizes(), reference.sizes());
      EXPECT_LT((dev_keys.cpu() - ref_keys).abs().max().item<double>(), 1e-5);
      EXPECT_LT((dev_values.cpu() - ref_values).abs().max().item<double>(), 1e-6);
      return (out - reference).abs().max().item<double>();
    }
    // padded: the fallback's form, forced on CPU float32.
    AttentionInputs in =
        padded ? MakePaddedInputs(layout, cos, sin) : MakePagedInputs(layout, cos, sin);
    EXPECT_EQ(in.padded(), padded);
    auto out = PagedSelfAttention(q, k, v, in, key_cache, value_cache);
    EXPECT_EQ(out.sizes(), reference.sizes());
    // The cache holds exactly the rotated keys and the values afterwards.
    EXPECT_LT((key_cache - ref_keys).abs().max().item<double>(), 1e-5);
    EXPECT_LT((value_cache - ref_values).abs().max().item<double>(), 1e-6);
    return (out - reference).abs().max().item<double>();
  }
};

// Tolerance: float32 with a different summation order (chunked online softmax, vector lanes) and
// a polynomial exp (~2 ulp): 2e-5 absolute on outputs of magnitude ~1.
constexpr double kTolerance = 2e-5;

TEST_F(PagedAttentionTest, DecodeRowsOverRaggedContexts) {
  Case c;
  for (int64_t ctx : {1, 2, 15, 16, 17, 31, 64, 100, 255, 256, 511}) {
    c.seqs.push_back({.cached = ctx, .num_new = 1});
  }
  EXPECT_LT(MaxError(c, false, 1), kTolerance);
  EXPECT_LT(MaxError(c, true, 1), kTolerance);
}

// A layer's cache read of 4 MB or more reads its keys and values ahead (kKvPrefetchBytes): 24
// sequences x ~400 positions x 1 KB of keys and values each. The results are the same.
TEST_F(PagedAttentionTest, LargeCacheReadsMatchTheReference) {
  Case c;
  for (int64_t b = 0; b < 24; ++b) c.seqs.push_back({.cached = 380 + 5 * b, .num_new = 1 + b % 3});
  EXPECT_LT(MaxError(c, false, 1), kTolerance);
  EXPECT_LT(MaxError(c, false, 2), kTolerance);
}

TEST_F(PagedAttentionTest, OneRowForward) {
  // Batch 1, one new token (a plain decode step): one-row views report any stride for their size-1
  // dimension, which must not stop the padded path from rotating q and k together (odd seed).
  Case c;
  c.seqs.push_back({.cached = 37, .num_new = 1});
  for (uint64_t seed : {1, 2}) {
    EXPECT_LT(MaxError(c, false, seed), kTolerance) << seed;
    EXPECT_LT(MaxError(c, true, seed), kTolerance) << seed;
  }
}

TEST_F(PagedAttentionTest, SeparateProjectionsThatLieBackToBack) {
  // One row: q's storage ends exactly where k's begins. The padded path's fused rotation must not
  // take them for one projection (it viewed past q's storage and threw: on an H200 in bf16 every
  // one-row SpecFormer observation failed and its sequences stopped drafting).
  Case c;
  c.adjacent_storages = true;
  c.seqs.push_back({.cached = 37, .num_new = 1});
  EXPECT_LT(MaxError(c, true, 2), kTolerance);
  EXPECT_LT(MaxError(c, false, 2), kTolerance);
  c.seqs.push_back({.cached = 5, .num_new = 3});
  EXPECT_LT(MaxError(c, true, 2), kTolerance);
}

TEST_F(PagedAttentionTest, ChunksAndPrefillsAcrossBlockBoundaries) {
  Case c;
  c.seqs = {{.cached = 0, .num_new = 512},
            {.cached = 13, .num_new = 5},
            {.cached = 16, .num_new = 16},
            {.cached = 47, .num_new = 33},
            {.cached = 200, .num_new = 1}};
  EXPECT_LT(MaxError(c, false, 2), kTolerance);
  EXPECT_LT(MaxError(c, true, 2), kTolerance);
}

TEST_F(PagedAttentionTest, TokenTreesSeeOnlyTheirAncestors) {
  Case c;
  // A verify chunk: pending token (row 0) and a tree hanging off it, positions by depth.
  SeqSpec tree{.cached = 40, .num_new = 7};
  tree.parents = {-1, 0, 0, 1, 1, 2, 5};
  tree.positions = {40, 41, 41, 42, 42, 42, 43};
  SeqSpec chain{.cached = 9, .num_new = 4};
  SeqSpec root_forest{.cached = 3, .num_new = 3};
  root_forest.parents = {-1, -1, 1};
  root_forest.positions = {3, 3, 4};
  c.seqs = {tree, chain, root_forest};
  EXPECT_LT(MaxError(c, false, 3), kTolerance);
  EXPECT_LT(MaxError(c, true, 3), kTolerance);
}

TEST_F(PagedAttentionTest, GroupedQueryAndHeadShapes) {
  for (auto [nh, nkv, hd] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {8, 8, 32}, {8, 1, 32}, {6, 2, 64}, {4, 2, 24}, {16, 2, 128}}) {
    Case c;
    c.nh = nh;
    c.nkv = nkv;
    c.hd = hd;
    c.block_size = 8;
    c.seqs = {{.cached = 70, .num_new = 3}, {.cached = 5, .num_new = 1}};
    EXPECT_LT(MaxError(c, false, 4), kTolerance) << nh << "/" << nkv << "/" << hd;
  }
}

TEST_F(PagedAttentionTest, SlidingWindowLimitsPrefixAndNewTokens) {
  Case c;
  c.window = 20;
  SeqSpec tree{.cached = 64, .num_new = 4};
  tree.parents = {-1, 0, 1, 0};
  tree.positions = {64, 65, 66, 65};
  c.seqs = {{.cached = 100, .num_new = 30}, {.cached = 3, .num_new = 2}, tree};
  EXPECT_LT(MaxError(c, false, 5), kTolerance);
  EXPECT_LT(MaxError(c, true, 5), kTolerance);
}

TEST_F(PagedAttentionTest, RandomBatchesMatchTheReference) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 12; ++trial) {
    Case c;
    c.block_size = std::uniform_int_distribution<int64_t>(1, 32)(rng);
    const int64_t B = std::uniform_int_distribution<int64_t>(1, 9)(rng);
    for (int64_t b = 0; b < B; ++b) {
      SeqSpec s;
      s.cached = std::uniform_int_distribution<int64_t>(0, 300)(rng);
      s.num_new = std::uniform_int_distribution<int64_t>(1, 12)(rng);
      if (rng() % 2) {  // a random tree, positions by depth
        std::vector<int64_t> depth(s.num_new);
        for (int64_t i = 0; i < s.num_new; ++i) {
          const int32_t parent =
              i == 0 ? -1 : std::uniform_int_distribution<int32_t>(-1, i - 1)(rng);
          s.parents.push_back(parent);
          depth[i] = parent < 0 ? 0 : depth[parent] + 1;
          s.positions.push_back(static_cast<int32_t>(s.cached + depth[i]));
        }
      }
      c.seqs.push_back(s);
    }
    EXPECT_LT(MaxError(c, false, 100 + trial), kTolerance) << "trial " << trial;
    EXPECT_LT(MaxError(c, true, 100 + trial), kTolerance) << "padded, trial " << trial;
  }
}

// Read-only rows (AddReaders) with keys of their own (RowKeys): queries that are not keys, each
// over its sequence's first `visible` cache positions plus its own first counts[r] keys, in one
// softmax. Reference: softmax over the explicitly gathered keys. Ragged contexts (0 included, so
// a row can see nothing and must get zeros), ragged own-key counts, GQA, both head-dim paths,
// one and two threads.
TEST(PagedAttentionReadersTest, ReadersWithTheirOwnKeysMatchTheReference) {
  for (int64_t hd : {32, 48}) {
    for (int threads : {1, 2}) {
      ConfigureCpuThreads(threads);
      torch::manual_seed(hd + threads);
      const int64_t nh = 8, nkv = 2, block_size = 16, D = 3;
      const std::vector<int64_t> visible = {0, 1, 17, 130, 40};
      const std::vector<int64_t> rows_per_seq = {2, 3, 1, 4, 2};
      int64_t total = 0;
      for (int64_t v : visible) total += v;
      const int64_t num_blocks = total / block_size + visible.size() + 2;
      BlockAllocator alloc(num_blocks, block_size);
      auto key_cache = torch::randn({num_blocks * block_size, nkv, hd});
      auto value_cache = torch::randn({num_blocks * block_size, nkv, hd});
      // Grown in turns so that the sequences' blocks interleave.
      for (size_t b = 0; b < visible.size(); ++b) ASSERT_TRUE(alloc.AddSequence(b + 1).ok());
      for (int64_t step = 0; step < 20; ++step) {
        for (size_t b = 0; b < visible.size(); ++b) {
          const int64_t want = std::min<int64_t>(visible[b], (step + 1) * 9);
          if (want > alloc.Length(b + 1)) {
            ASSERT_TRUE(alloc.Append(b + 1, want - alloc.Length(b + 1)).ok());
          }
        }
      }
      PagedAttentionLayout layout(block_size, 0);
      int64_t N = 0;
      for (size_t b = 0; b < visible.size(); ++b) {
        layout.AddReaders(alloc.BlockTable(b + 1), visible[b], rows_per_seq[b]);
        N += rows_per_seq[b];
      }
      ASSERT_EQ(layout.num_rows(), N);
      for (int64_t r = 0; r < N; ++r) EXPECT_EQ(layout.write_slots()[r], -1);
      auto q = torch::randn({N, nh, hd});
      RowKeys own{.keys = torch::randn({N, D, nkv, hd}), .values = torch::randn({N, D, nkv, hd})};
      for (int64_t r = 0; r < N; ++r) own.counts.push_back(static_cast<int32_t>(r % (D + 1)));
      auto out = PagedAttentionCpu(q, key_cache, value_cache, layout, &own);
      auto plain = PagedAttentionCpu(q, key_cache, value_cache, layout);

      int64_t row = 0;
      for (size_t b = 0; b < visible.size(); ++b) {
        std::vector<int64_t> slots;
        for (int64_t p = 0; p < visible[b]; ++p) slots.push_back(alloc.SlotOf(b + 1, p));
        auto index = torch::tensor(slots, torch::kLong);
        for (int64_t i = 0; i < rows_per_seq[b]; ++i, ++row) {
          const int64_t c = own.counts[row];
          for (bool with_own : {true, false}) {
            auto keys = key_cache.index_select(0, index);  // [T, nkv, hd]
            auto values = value_cache.index_select(0, index);
            if (with_own) {
              keys = torch::cat({keys, own.keys[row].narrow(0, 0, c)}, 0);
              values = torch::cat({values, own.values[row].narrow(0, 0, c)}, 0);
            }
            const auto& got = with_own ? out : plain;
            const int64_t T = keys.size(0);
            if (T == 0) {
              EXPECT_EQ(got[row].abs().max().item<float>(), 0.0f) << "row " << row;
              continue;
            }
            auto ref = MaskedAttention(q[row].view({1, 1, nh, hd}), keys.view({1, T, nkv, hd}),
                                       values.view({1, T, nkv, hd}),
                                       torch::ones({1, 1, 1, 1, T}, torch::kBool))
                           .view({-1});
            EXPECT_LT((got[row] - ref).abs().max().item<double>(), kTolerance)
                << "hd " << hd << " threads " << threads << " row " << row << " own " << with_own;
          }
        }
      }
      // Malformed own keys are refused, not read out of bounds.
      RowKeys bad = own;
      bad.counts[0] = D + 1;
      EXPECT_THROW(PagedAttentionCpu(q, key_cache, value_cache, layout, &bad), c10::Error);
      bad = own;
      bad.counts.pop_back();
      EXPECT_THROW(PagedAttentionCpu(q, key_cache, value_cache, layout, &bad), c10::Error);
    }
  }
  ConfigureCpuThreads(1);
}

TEST(CpuKernelsTest, RmsNormAndSiluMulMatchLibTorch) {
  torch::manual_seed(0);
  auto x = torch::randn({5, 256}) * 3;
  auto w = torch::randn({256});
  auto var = x.pow(2).mean(-1, true);
  auto ref = w * (x * torch::rsqrt(var + 1e-5));
  EXPECT_LT((RmsNormCpu(x, w, 1e-5) - ref).abs().max().item<double>(), 1e-5);
  auto gu = torch::randn({3, 2, 2 * 96}) * 8;  // large |gate| exercises both exp branches
  auto silu_ref = torch::silu(gu.narrow(-1, 0, 96)) * gu.narrow(-1, 96, 96);
  auto silu = SiluMulCpu(gu);
  EXPECT_EQ(silu.sizes(), silu_ref.sizes());
  EXPECT_LT((silu - silu_ref).abs().max().item<double>(), 1e-4);
  EXPECT_LT(((silu - silu_ref).abs() / (silu_ref.abs() + 1e-3)).max().item<double>(), 1e-5);
}

TEST(RopeTest, SignedFormEqualsRotateHalf) {
  torch::manual_seed(3);
  ModelConfig config;
  config.head_dim = 32;
  config.rope_theta = 10000.0;
  auto positions = torch::arange(0, 40, torch::kLong) * 7;
  auto [cos, sin] =
      RopeCosSin(RopeInverseFrequencies(config, torch::kCPU), positions, torch::kFloat);
  auto fused = torch::randn({40, 12, 32});
  auto x = fused.narrow(1, 2, 8);  // strided heads, as in a fused projection
  auto want = ApplyRope(x, cos, sin);
  auto got = ApplyRopeSigned(x, cos, SignedSin(sin));
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-6);
}

TEST(RmsNormTest, FewOpsFormEqualsTheReferenceFormula) {
  // RmsNormFewOps (RMSNorm's inference path off the CPU kernel: a GPU, half precision) against
  // HF's formula, in float32 and bfloat16, a zero row included (eps keeps it finite).
  torch::manual_seed(4);
  auto weight = torch::rand({64}) + 0.5;
  const auto eps = torch::full({}, 1e-5, torch::kFloat);
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    auto x = (torch::randn({9, 64}) * 3).to(dtype);
    x[2].zero_();
    auto xf = x.to(torch::kFloat);
    auto want = weight.to(dtype) * (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + 1e-5)).to(dtype);
    auto got = RmsNormFewOps(x, weight.to(dtype), eps);
    EXPECT_EQ(got.scalar_type(), dtype);
    EXPECT_TRUE(torch::isfinite(got).all().item<bool>());
    // bfloat16: one rounding of the normalised value may land on the neighbouring bf16 (2^-7).
    const double tol = dtype == torch::kFloat ? 2e-6 : 2e-2;
    EXPECT_LT((got.to(torch::kFloat) - want.to(torch::kFloat)).abs().max().item<double>(), tol)
        << dtype;
  }
  // The module takes this path for bfloat16 on the CPU (no autograd).
  RMSNorm norm(64, 1e-5);
  torch::NoGradGuard no_grad;
  norm->weight.copy_(weight);
  norm->to(torch::kBFloat16);
  auto x = torch::randn({5, 64}).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(norm->forward(x), RmsNormFewOps(x, norm->weight, eps)));
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

TEST(CpuKernelsTest, SmallMatmulMatchesLinearForEveryRowCount) {
  torch::manual_seed(1);
  auto w = torch::randn({70, 48});
  auto b = torch::randn({70});
  for (int64_t rows = 1; rows <= kSmallMatmulMaxRows; ++rows) {
    auto x = torch::randn({rows, 48});
    auto r = torch::randn({rows, 70});
    ASSERT_TRUE(SmallMatmulApplies(x, w));
    auto ref = torch::nn::functional::linear(x, w, b) + r;
    EXPECT_LT((SmallMatmulCpu(x, w, b, &r) - ref).abs().max().item<double>(), 1e-4) << rows;
    EXPECT_LT((SmallMatmulCpu(x, w, {}, nullptr) - x.matmul(w.t())).abs().max().item<double>(),
              1e-4)
        << rows;
  }
  EXPECT_FALSE(SmallMatmulApplies(torch::randn({kSmallMatmulMaxRows + 1, 48}), w));
  EXPECT_FALSE(SmallMatmulApplies(torch::randn({2, 40}), torch::randn({70, 40})));  // k % 16
}

// The bfloat16 product is the product of the bfloat16-rounded operands summed in float32: against
// that reference (computed in double) it is within float32 summation error, for every row count
// and for output features that are not a multiple of the kernel's four (70 and 1027).
TEST(CpuKernelsTest, Bf16MatmulIsTheProductOfTheRoundedOperands) {
  if (!Bf16MatmulRuns()) GTEST_SKIP() << "no AVX512-BF16 on this CPU or build";
  torch::manual_seed(2);
  for (int64_t n : {70, 1027}) {
    for (int64_t k : {32, 96}) {
      auto w = torch::randn({n, k});
      auto b = torch::randn({n});
      auto w16 = w.to(torch::kBFloat16).contiguous();
      const auto* bits = reinterpret_cast<const uint16_t*>(w16.data_ptr<at::BFloat16>());
      for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{33}, kSmallMatmulMaxRows}) {
        auto x = torch::randn({rows, k});
        auto r = torch::randn({rows, n});
        auto y = torch::empty({rows, n});
        SmallMatmulBf16Raw(x.data_ptr<float>(), rows, k, bits, n, b.data_ptr<float>(),
                           r.data_ptr<float>(), y.data_ptr<float>());
        auto ref = torch::nn::functional::linear(x.to(torch::kBFloat16).to(torch::kDouble),
                                                 w16.to(torch::kDouble), b.to(torch::kDouble)) +
                   r.to(torch::kDouble);
        EXPECT_LT((y.to(torch::kDouble) - ref).abs().max().item<double>(), 1e-4)
            << n << " x " << k << ", " << rows << " rows";
        // Not the float32 product: the rounding is real (so the check above can fail).
        auto exact = torch::nn::functional::linear(x, w, b) + r;
        EXPECT_GT((y - exact).abs().max().item<double>(), 1e-4);
      }
    }
  }
  float x[32] = {}, y[1];
  uint16_t w[32] = {};
  EXPECT_THROW(SmallMatmulBf16Raw(x, 1, 16, w, 1, nullptr, nullptr, y), c10::Error);  // k % 32
  EXPECT_THROW(SmallMatmulBf16Raw(x, 0, 32, w, 1, nullptr, nullptr, y), c10::Error);
}

// A row's product does not depend on the rows beside it: a draft token verified among others gets
// bitwise the logits it would get decoded alone (greedy speculation stays exact at near-ties).
// Covers every row blocking (8-row blocks, the AVX-512 4-6-row tiles) and the tiles' tail of
// output features (70 and 4098 are not multiples of 4).
TEST(CpuKernelsTest, EachRowOfAProductIsBitwiseItsOneRowProduct) {
  torch::manual_seed(4);
  for (int64_t n : {70, 256, 4098}) {
    auto w = torch::randn({n, 256});
    auto b = torch::randn({n});
    auto x = torch::randn({kSmallMatmulMaxRows, 256});
    auto r = torch::randn({kSmallMatmulMaxRows, n});
    std::vector<at::Tensor> alone;
    for (int64_t i = 0; i < kSmallMatmulMaxRows; ++i) {
      at::Tensor ri = r.narrow(0, i, 1).contiguous();
      alone.push_back(SmallMatmulCpu(x.narrow(0, i, 1), w, b, &ri));
    }
    for (int64_t rows :
         std::vector<int64_t>{2, 5, 7, 8, 9, 13, 16, 23, 31, 64, 97, kSmallMatmulMaxRows}) {
      at::Tensor rr = r.narrow(0, 0, rows).contiguous();
      at::Tensor all = SmallMatmulCpu(x.narrow(0, 0, rows), w, b, &rr);
      for (int64_t i = 0; i < rows; ++i) {
        ASSERT_TRUE(torch::equal(all.narrow(0, i, 1), alone[i]))
            << n << " x " << rows << ", row " << i;
      }
    }
  }
}

// g(rows, x, r, bias, residual, extras) for 1-kSmallMatmulMaxRows rows of random x [rows, k]
// (every count to 20, then every 13th), without and with bias (b [n]) and residual r [rows, n].
template <typename G>
void ForRowCountsWithAndWithoutExtras(int64_t n, int64_t k, const at::Tensor& b, const G& g) {
  for (int64_t rows = 1; rows <= kSmallMatmulMaxRows; rows += (rows < 20 ? 1 : 13)) {
    auto x = torch::randn({rows, k});
    auto r = torch::randn({rows, n});
    for (bool extras : {false, true}) {
      g(rows, x, r, extras ? b.data_ptr<float>() : nullptr, extras ? r.data_ptr<float>() : nullptr,
        extras);
    }
  }
}

// f(n, k, threads) for each [n, k] weight shape, on one kernel thread and on two (two after).
template <typename F>
void ForShapesOnOneAndTwoThreads(const std::vector<std::pair<int64_t, int64_t>>& shapes,
                                 const F& f) {
  for (int threads : {1, 2}) {
    ConfigureCpuThreads(threads);
    for (auto [n, k] : shapes) f(n, k, threads);
  }
  ConfigureCpuThreads(2);
}

// The packed weights' product is bitwise SmallMatmulRaw's (so bitwise each row's one-row
// product): every row count up to kSmallMatmulMaxRows (the 1-8-row tiles, 8-row blocks and their
// remainders), output groups that fill the 3- and 4-group tiles and ones that leave a tail (16,
// 48, 80, 4096 outputs), inner dimensions of one to 48 panel steps, with and without bias and
// residual, on one thread and on two.
TEST(CpuKernelsTest, PackedMatmulIsBitwiseTheSmallMatmul) {
  if (!PackedMatmulRuns()) GTEST_SKIP() << "no AVX-512 on this CPU or build";
  torch::manual_seed(5);
  ForShapesOnOneAndTwoThreads(
      {{16, 16}, {48, 256}, {80, 768}, {4096, 256}, {112, 48}},
      [](int64_t n, int64_t k, int threads) {
        auto w = torch::randn({n, k});
        auto packed = torch::empty({n * k});
        PackMatmulWeights(w.data_ptr<float>(), n, k, packed.data_ptr<float>());
        auto b = torch::randn({n});
        ForRowCountsWithAndWithoutExtras(
            n, k, b,
            [&](int64_t rows, const at::Tensor& x, const at::Tensor& r, const float* bias,
                const float* residual, bool extras) {
              auto want = torch::empty({rows, n});
              auto got = torch::full({rows, n}, std::nanf(""));
              SmallMatmulRaw(x.data_ptr<float>(), rows, k, w.data_ptr<float>(), n, bias, residual,
                             want.data_ptr<float>());
              PackedMatmulRaw(x.data_ptr<float>(), rows, k, packed.data_ptr<float>(), n, bias,
                              residual, got.data_ptr<float>());
              ASSERT_TRUE(torch::equal(got, want))
                  << n << " x " << k << ", " << rows << " rows, extras " << extras << ", "
                  << threads << " threads; max diff " << (got - want).abs().max().item<double>();
            });
      });
  float x[32] = {}, w[32 * 32] = {}, y[64];
  EXPECT_THROW(PackedMatmulRaw(x, 1, 16, w, 8, nullptr, nullptr, y), c10::Error);  // n % 16
  EXPECT_THROW(PackedMatmulRaw(x, 1, 8, w, 16, nullptr, nullptr, y), c10::Error);  // k % 16
  EXPECT_THROW(PackedMatmulRaw(x, 0, 16, w, 16, nullptr, nullptr, y), c10::Error);
  EXPECT_THROW(PackedMatmulRaw(x, kSmallMatmulMaxRows + 1, 16, w, 16, nullptr, nullptr, y),
               c10::Error);
  EXPECT_THROW(PackMatmulWeights(w, 24, 16, y), c10::Error);
}

// The int8 weights are each output row's weights scaled by its largest magnitude to [-127, 127]
// and rounded (a zero row: scale 0, outputs bias + residual only), and the product is x times
// those dequantised weights in float32: against that reference (in double) within float32
// summation error for every row count up to kSmallMatmulMaxRows (1-8-row tiles, 8-row blocks
// over group tiles), group counts that fill the 3/4/6/8-group tiles and ones that leave a tail,
// with and without bias and residual, on one thread and on two. Not the float32 product (the
// rounding is real), but within the quantisation's bound of it.
TEST(CpuKernelsTest, Int8MatmulIsTheProductOfTheScaledWeights) {
  if (!Int8MatmulRuns()) GTEST_SKIP() << "no AVX-512 on this CPU or build";
  torch::manual_seed(8);
  ForShapesOnOneAndTwoThreads(
      {{16, 4}, {48, 128}, {112, 384}, {1024, 128}, {208, 36}},
      [](int64_t n, int64_t k, int threads) {
        auto w = torch::randn({n, k});
        w[n / 2].zero_();
        std::vector<int8_t> packed(n * k);
        auto scales = torch::full({n}, -1.0f);
        PackInt8MatmulWeights(w.data_ptr<float>(), n, k, packed.data(), scales.data_ptr<float>());
        // The reference unpacks the panels: q[r][p] = packed[(r / 16) k 16 + p 16 + r % 16].
        auto q = torch::empty({n, k}, torch::kDouble);
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t p = 0; p < k; ++p) q[r][p] = packed[(r / 16) * k * 16 + p * 16 + r % 16];
        }
        const auto amax = std::get<0>(w.abs().max(1));
        ASSERT_TRUE(torch::allclose(scales, amax / 127.0f)) << n << " x " << k;
        EXPECT_EQ(scales[n / 2].item<float>(), 0.0f);
        EXPECT_EQ(q.abs().max().item<double>(), 127.0);  // every non-zero row reaches +-127
        // Each weight rounded to its nearest step (ties may go either way in float32).
        const auto steps =
            (w.to(torch::kDouble) / scales.to(torch::kDouble).unsqueeze(1)).nan_to_num(0.0);
        ASSERT_LE((q - steps).abs().max().item<double>(), 0.5 + 1e-4) << n << " x " << k;
        auto dequantised = q * scales.to(torch::kDouble).unsqueeze(1);
        auto b = torch::randn({n});
        ForRowCountsWithAndWithoutExtras(
            n, k, b,
            [&](int64_t rows, const at::Tensor& x, const at::Tensor& r, const float* bias,
                const float* residual, bool extras) {
              auto got = torch::full({rows, n}, std::nanf(""));
              Int8MatmulRaw(x.data_ptr<float>(), rows, k, packed.data(), scales.data_ptr<float>(),
                            n, bias, residual, got.data_ptr<float>());
              auto want = torch::matmul(x.to(torch::kDouble), dequantised.t());
              if (extras) want = want + b.to(torch::kDouble) + r.to(torch::kDouble);
              ASSERT_LT((got.to(torch::kDouble) - want).abs().max().item<double>(), 1e-4 * k)
                  << n << " x " << k << ", " << rows << " rows, extras " << extras << ", "
                  << threads << " threads";
              // Rounding each weight moves it by at most half a step: scale / 2 per weight.
              auto exact = torch::matmul(x, w.t());
              if (extras) exact = exact + b + r;
              const double bound = (x.abs().sum(1).to(torch::kDouble).unsqueeze(1) *
                                    (scales.to(torch::kDouble).unsqueeze(0) / 2))
                                       .max()
                                       .item<double>();
              const double off = (got - exact).abs().max().item<double>();
              EXPECT_GT(off, 1e-5);
              EXPECT_LE(off, bound + 1e-3);
            });
      });
  float x[32] = {}, s[32] = {}, y[64];
  int8_t w[32 * 32] = {};
  EXPECT_THROW(Int8MatmulRaw(x, 1, 16, w, s, 8, nullptr, nullptr, y), c10::Error);  // n % 16
  EXPECT_THROW(Int8MatmulRaw(x, 1, 6, w, s, 16, nullptr, nullptr, y), c10::Error);  // k % 4
  EXPECT_THROW(Int8MatmulRaw(x, 0, 16, w, s, 16, nullptr, nullptr, y), c10::Error);
  EXPECT_THROW(PackInt8MatmulWeights(x, 24, 4, w, s), c10::Error);
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// Splitting rows (attention) or output features (small matmul) across threads changes no value:
// every output element is computed by one thread in the same order.
TEST(CpuKernelsTest, ThreadCountDoesNotChangeResults) {
  torch::manual_seed(3);
  const int64_t nh = 8, nkv = 4, hd = 32, bs = 16, B = 2, ctx = 300;  // 6 rows: a small forward
  BlockAllocator alloc(B * (ctx / bs + 2), bs);
  PagedAttentionLayout layout(bs, 0);
  for (SeqId s = 1; s <= B; ++s) {
    ASSERT_TRUE(alloc.AddSequence(s).ok());
    ASSERT_TRUE(alloc.Append(s, ctx + 3).ok());
  }
  for (SeqId s = 1; s <= B; ++s) layout.AddSequence(alloc.BlockTable(s), ctx, 3);
  auto kc = torch::randn({alloc.num_blocks() * bs, nkv, hd});
  auto vc = torch::randn({alloc.num_blocks() * bs, nkv, hd});
  auto q = torch::randn({B * 3, nh, hd});
  auto w = torch::randn({4096, 256});
  auto x = torch::randn({3, 256});
  ConfigureCpuThreads(1);
  auto attention_1 = PagedAttentionCpu(q, kc, vc, layout);
  auto matmul_1 = SmallMatmulCpu(x, w, {}, nullptr);
  ConfigureCpuThreads(2);
  ASSERT_EQ(KernelThreads(), 2);
  auto attention_2 = PagedAttentionCpu(q, kc, vc, layout);
  auto matmul_2 = SmallMatmulCpu(x, w, {}, nullptr);
  ConfigureCpuThreads(1);
  EXPECT_TRUE(torch::equal(attention_1, attention_2));
  EXPECT_TRUE(torch::equal(matmul_1, matmul_2));
}

// One sequence (batch 1, a drafted step's rows) is split by key/value heads across the threads;
// each query vector comes out bitwise as computed on one thread, also with each row's own keys.
TEST(CpuKernelsTest, HeadSplitAttentionOfOneSequenceMatchesOneThread) {
  torch::manual_seed(5);
  const int64_t nh = 8, nkv = 4, hd = 32, bs = 16, ctx = 250, rows = 5;
  BlockAllocator alloc(ctx / bs + 2, bs);
  ASSERT_TRUE(alloc.AddSequence(1).ok());
  ASSERT_TRUE(alloc.Append(1, ctx + rows).ok());
  PagedAttentionLayout layout(bs, 0);
  layout.AddSequence(alloc.BlockTable(1), ctx, rows);
  auto kc = torch::randn({alloc.num_blocks() * bs, nkv, hd});
  auto vc = torch::randn({alloc.num_blocks() * bs, nkv, hd});
  auto q = torch::randn({rows, nh, hd});
  RowKeys own{.keys = torch::randn({rows, 2, nkv, hd}),
              .values = torch::randn({rows, 2, nkv, hd}),
              .counts = {0, 1, 2, 1, 2}};
  ConfigureCpuThreads(1);
  auto plain_1 = PagedAttentionCpu(q, kc, vc, layout);
  auto own_1 = PagedAttentionCpu(q, kc, vc, layout, &own);
  ConfigureCpuThreads(2);
  ASSERT_EQ(KernelThreads(), 2);
  auto plain_2 = PagedAttentionCpu(q, kc, vc, layout);
  auto own_2 = PagedAttentionCpu(q, kc, vc, layout, &own);
  ConfigureCpuThreads(1);
  EXPECT_TRUE(torch::equal(plain_1, plain_2));
  EXPECT_TRUE(torch::equal(own_1, own_2));
  EXPECT_FALSE(torch::equal(plain_1, own_1));  // the row keys were attended
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// The drafters' softmax pieces: sum and values of exp(x - max) within float rounding of the
// double reference, over rows as long as a vocabulary with a tail past the 16 lanes; -inf
// entries are exactly 0 in ExpBelowRaw and next to nothing in the sums.
TEST(CpuKernelsTest, ExponentialsBelowAShiftMatchTheReference) {
  torch::manual_seed(9);
  for (int64_t n : {1, 15, 16, 1000, 4096, 4101}) {
    auto x = torch::randn({n}) * 4;
    if (n > 3) x.narrow(0, 0, n / 3).fill_(-std::numeric_limits<float>::infinity());
    const float shift = x.max().item<float>();
    auto want = (x.to(torch::kDouble) - shift).exp();
    const double want_sum = want.sum().item<double>();
    EXPECT_NEAR(SumExpBelow(x.data_ptr<float>(), n, shift), want_sum, 1e-5 * want_sum) << n;
    auto out = torch::full({n}, std::nanf(""));
    const float sum = ExpBelowRaw(x.data_ptr<float>(), n, shift, out.data_ptr<float>());
    EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum) << n;
    EXPECT_LT((out.to(torch::kDouble) - want).abs().max().item<double>(), 1e-6) << n;
    if (n > 3) {
      EXPECT_TRUE(torch::all(out.narrow(0, 0, n / 3) == 0).item<bool>()) << n;
    }
  }
}

}  // namespace
}  // namespace specula
