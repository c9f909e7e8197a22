#include "common/kv/paged_kv_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/model/model_runner.h"
#include "common/model/transformer.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// PagedKvCache on its own: rows written at the allocator's slots, then compacted by KeepOnly.

constexpr int64_t kLayers = 2, kKvHeads = 2, kHeadDim = 4, kBlock = 4;

std::unique_ptr<PagedKvCache> MakeCache(int64_t num_blocks) {
  KvCacheOptions options;
  options.block_size = kBlock;
  options.num_blocks = num_blocks;
  auto cache =
      PagedKvCache::Create(kLayers, kKvHeads, kHeadDim, torch::kFloat, torch::kCPU, options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(cache).value();
}

// The value written for (layer, position) of a sequence: keys +v, values -v.
float Tag(SeqId seq, int64_t layer, int64_t position) {
  return static_cast<float>(1000 * seq + 100 * layer + position);
}

void WriteRows(PagedKvCache& cache, SeqId seq) {
  const auto slots = cache.allocator().Slots(seq);
  for (int64_t l = 0; l < cache.num_layers(); ++l) {
    for (size_t p = 0; p < slots.size(); ++p) {
      cache.keys(l)[slots[p]].fill_(Tag(seq, l, p));
      cache.values(l)[slots[p]].fill_(-Tag(seq, l, p));
    }
  }
}

// Checks that position p of `seq` holds the tag of original position expected[p].
void ExpectRows(PagedKvCache& cache, SeqId seq, const std::vector<int64_t>& expected) {
  const auto slots = cache.allocator().Slots(seq);
  ASSERT_EQ(slots.size(), expected.size());
  for (int64_t l = 0; l < cache.num_layers(); ++l) {
    for (size_t p = 0; p < slots.size(); ++p) {
      const float tag = Tag(seq, l, expected[p]);
      EXPECT_TRUE(torch::equal(cache.keys(l)[slots[p]], torch::full({kKvHeads, kHeadDim}, tag)))
          << "seq " << seq << " layer " << l << " position " << p << " should hold key of "
          << expected[p] << ", holds " << cache.keys(l)[slots[p]][0][0].item<float>();
      EXPECT_TRUE(torch::equal(cache.values(l)[slots[p]], torch::full({kKvHeads, kHeadDim}, -tag)))
          << "seq " << seq << " layer " << l << " position " << p;
    }
  }
}

TEST(PagedKvCacheTest, CreateShapesAndBudget) {
  auto cache = MakeCache(8);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->num_layers(), kLayers);
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(cache->keys(l).sizes(), (std::vector<int64_t>{8 * kBlock, kKvHeads, kHeadDim}));
    EXPECT_EQ(cache->values(l).sizes(), (std::vector<int64_t>{8 * kBlock, kKvHeads, kHeadDim}));
    EXPECT_EQ(cache->keys(l).scalar_type(), torch::kFloat);
  }
  // 2 (k, v) * 2 layers * 4 positions * 2 heads * 4 dims * 4 bytes.
  EXPECT_EQ(cache->bytes_per_block(), 512);
  const KvCacheStats stats = cache->stats();
  EXPECT_EQ(stats.num_blocks, 8);
  EXPECT_EQ(stats.free_blocks, 8);
  EXPECT_EQ(stats.block_size, kBlock);
  EXPECT_EQ(stats.num_sequences, 0);
  EXPECT_DOUBLE_EQ(stats.usage(), 0.0);

  // A memory budget: 1 MB / 512 bytes per block.
  KvCacheOptions by_memory;
  by_memory.block_size = kBlock;
  by_memory.memory_mb = 1.0;
  auto sized =
      PagedKvCache::Create(kLayers, kKvHeads, kHeadDim, torch::kFloat, torch::kCPU, by_memory);
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_EQ((*sized)->stats().num_blocks, 2048);
  // bf16 halves the block size.
  auto half =
      PagedKvCache::Create(kLayers, kKvHeads, kHeadDim, torch::kBFloat16, torch::kCPU, by_memory);
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_EQ((*half)->bytes_per_block(), 256);
  EXPECT_EQ((*half)->stats().num_blocks, 4096);
}

TEST(PagedKvCacheTest, CreateErrors) {
  KvCacheOptions tiny;
  tiny.block_size = kBlock;
  tiny.memory_mb = 0.0001;  // 104 bytes < one block
  auto none = PagedKvCache::Create(kLayers, kKvHeads, kHeadDim, torch::kFloat, torch::kCPU, tiny);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("holds no block"));
  EXPECT_THAT(none.status().message(), HasSubstr("512 bytes"));

  KvCacheOptions zero_block;
  zero_block.block_size = 0;
  auto bad =
      PagedKvCache::Create(kLayers, kKvHeads, kHeadDim, torch::kFloat, torch::kCPU, zero_block);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("block_size"));
}

// Seq 1 gets non-contiguous blocks (0, 2, 3) because seq 2 took block 1 in between.
struct TwoSequences {
  std::unique_ptr<PagedKvCache> cache = MakeCache(8);
  TwoSequences() {
    BlockAllocator& alloc = cache->allocator();
    EXPECT_TRUE(alloc.AddSequence(1).ok());
    EXPECT_TRUE(alloc.AddSequence(2).ok());
    EXPECT_TRUE(alloc.Append(1, 3).ok());
    EXPECT_TRUE(alloc.Append(2, 4).ok());
    EXPECT_TRUE(alloc.Append(1, 7).ok());  // length 10
    EXPECT_EQ(alloc.Slots(1), (std::vector<int64_t>{0, 1, 2, 3, 8, 9, 10, 11, 12, 13}));
    WriteRows(*cache, 1);
    WriteRows(*cache, 2);
  }
};

TEST(PagedKvCacheTest, KeepOnlyMovesKeptRowsAndTruncates) {
  TwoSequences t;
  PagedKvCache& cache = *t.cache;
  ASSERT_EQ(cache.stats().free_blocks, 4);
  // Committed prefix of 3; keep uncommitted offsets 1, 4, 6 = positions 4, 7, 9 (across blocks).
  ASSERT_TRUE(cache.KeepOnly(1, 3, {1, 4, 6}).ok());
  EXPECT_EQ(cache.allocator().Length(1), 6);
  ExpectRows(cache, 1, {0, 1, 2, 4, 7, 9});
  // Length 6 needs 2 blocks: block 3 went back to the free list.
  EXPECT_EQ(cache.stats().free_blocks, 5);
  // The other sequence is untouched.
  ExpectRows(cache, 2, {0, 1, 2, 3});
}

// Each kept row moves onto the one before it: every row is read before another lands on it.
TEST(PagedKvCacheTest, KeepOnlyShiftsOverlappingRowsInOrder) {
  TwoSequences t;
  PagedKvCache& cache = *t.cache;
  ASSERT_TRUE(cache.KeepOnly(1, 2, {1, 2, 3, 5, 7}).ok());
  ExpectRows(cache, 1, {0, 1, 3, 4, 5, 7, 9});
  ExpectRows(cache, 2, {0, 1, 2, 3});
}

// One batched commit leaves the cache exactly as committing each sequence alone does.
TEST(PagedKvCacheTest, KeepOnlyAllEqualsPerSequenceCommits) {
  TwoSequences batched, single;
  ASSERT_TRUE(batched.cache->allocator().Append(2, 5).ok());  // length 9, positions 4..8 new
  ASSERT_TRUE(single.cache->allocator().Append(2, 5).ok());
  WriteRows(*batched.cache, 2);
  WriteRows(*single.cache, 2);
  const std::vector<PathCommit> commits = {{.seq = 1, .start = 3, .offsets = {1, 4, 6}},
                                           {.seq = 2, .start = 4, .offsets = {0, 2, 3}}};
  ASSERT_TRUE(batched.cache->KeepOnlyAll(commits).ok());
  for (const PathCommit& c : commits) {
    ASSERT_TRUE(single.cache->KeepOnly(c.seq, c.start, c.offsets).ok());
  }
  for (SeqId seq : {1, 2}) {
    for (int64_t l = 0; l < kLayers; ++l) {
      auto [bk, bv] = batched.cache->SequenceKv(l, seq);
      auto [sk, sv] = single.cache->SequenceKv(l, seq);
      EXPECT_TRUE(torch::equal(bk, sk) && torch::equal(bv, sv)) << "seq " << seq << " layer " << l;
    }
  }
  ExpectRows(*batched.cache, 1, {0, 1, 2, 4, 7, 9});
  ExpectRows(*batched.cache, 2, {0, 1, 2, 3, 4, 6, 7});
  EXPECT_EQ(batched.cache->stats().free_blocks, single.cache->stats().free_blocks);
}

TEST(PagedKvCacheTest, KeepOnlyAllValidatesEverythingFirst) {
  TwoSequences t;
  PagedKvCache& cache = *t.cache;
  // The second commit is invalid: the first must not have moved anything.
  Status bad = cache.KeepOnlyAll(
      {{.seq = 1, .start = 3, .offsets = {1, 4}}, {.seq = 2, .start = 1, .offsets = {5}}});
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad;
  ExpectRows(cache, 1, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  Status twice = cache.KeepOnlyAll(
      {{.seq = 1, .start = 3, .offsets = {1}}, {.seq = 1, .start = 3, .offsets = {2}}});
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument) << twice;
  EXPECT_NE(twice.message().find("twice"), std::string::npos) << twice;
  ExpectRows(cache, 1, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_TRUE(cache.KeepOnlyAll({}).ok());
}

TEST(PagedKvCacheTest, KeepOnlyWithOverlappingMoves) {
  TwoSequences t;
  PagedKvCache& cache = *t.cache;
  // Every destination is the previous source: 3 <- 4 <- 5 <- 6.
  ASSERT_TRUE(cache.KeepOnly(1, 2, {1, 2, 3, 4}).ok());
  ExpectRows(cache, 1, {0, 1, 3, 4, 5, 6});
  // A leading run already in place plus a move.
  ASSERT_TRUE(cache.KeepOnly(1, 1, {0, 1, 4}).ok());
  ExpectRows(cache, 1, {0, 1, 3, 6});
  ExpectRows(cache, 2, {0, 1, 2, 3});
}

TEST(PagedKvCacheTest, KeepOnlyEdgeCases) {
  TwoSequences t;
  PagedKvCache& cache = *t.cache;
  // Keeping everything is a no-op.
  ASSERT_TRUE(cache.KeepOnly(1, 0, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}).ok());
  ExpectRows(cache, 1, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  // Start at the end with nothing to keep is a no-op too.
  ASSERT_TRUE(cache.KeepOnly(1, 10, {}).ok());
  EXPECT_EQ(cache.allocator().Length(1), 10);
  // Nothing accepted: truncate to the committed prefix.
  ASSERT_TRUE(cache.KeepOnly(1, 5, {}).ok());
  ExpectRows(cache, 1, {0, 1, 2, 3, 4});
  EXPECT_EQ(cache.stats().free_blocks, 5);
}

TEST(PagedKvCacheTest, KeepOnlyErrorsLeaveTheSequenceUnchanged) {
  TwoSequences t;
  PagedKvCache& cache = *t.cache;
  const std::vector<int64_t> all = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};

  Status unknown = cache.KeepOnly(5, 0, {0});
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_EQ(unknown.message(), "unknown sequence 5");

  Status past_end = cache.KeepOnly(1, 11, {});
  EXPECT_EQ(past_end.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(past_end.message(), "keep-only start 11 outside sequence of length 10");
  EXPECT_EQ(cache.KeepOnly(1, -1, {}).code(), StatusCode::kOutOfRange);

  Status repeated = cache.KeepOnly(1, 3, {1, 1});
  EXPECT_EQ(repeated.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(repeated.message(), HasSubstr("strictly increasing"));
  EXPECT_THAT(repeated.message(), HasSubstr("offset 1 is 1"));

  Status decreasing = cache.KeepOnly(1, 3, {4, 2});
  EXPECT_EQ(decreasing.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(decreasing.message(), HasSubstr("offset 1 is 2"));

  // Offset 7 from start 3 is position 10, past the end.
  Status outside = cache.KeepOnly(1, 3, {0, 7});
  EXPECT_EQ(outside.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.message(), HasSubstr("inside the 7 uncommitted positions; offset 1 is 7"));

  EXPECT_EQ(cache.KeepOnly(1, 3, {-1, 2}).code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(cache.allocator().Length(1), 10);
  ExpectRows(cache, 1, all);
  ExpectRows(cache, 2, {0, 1, 2, 3});
  EXPECT_EQ(cache.stats().free_blocks, 4);
}

// ---------------------------------------------------------------------------------------------
// Through ModelRunner: committing a tree path with KeepOnly must leave the cache equal to one built
// by decoding the accepted path alone. ModelRunner does not expose its cache, so equality is
// checked through what the cache determines: the logits of every later token.

// HF init, then larger weights and non-trivial norms so that attention is far from uniform and a
// wrong cache row shows up clearly in the logits.
std::shared_ptr<CausalLMImpl> MakeModel(const ModelConfig& config, uint64_t seed) {
  auto model = MakeTinyModel(config, seed, /*weight_scale=*/10.0);
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed + 1);
  for (auto& p : model->named_parameters()) {
    if (p.key().find("norm") != std::string::npos) p.value().uniform_(0.5, 1.5);
  }
  return model;
}

std::unique_ptr<ModelRunner> MakeRunner(std::shared_ptr<CausalLMImpl> model, int64_t num_blocks) {
  ModelRunnerOptions options;
  options.kv.block_size = kBlock;
  options.kv.num_blocks = num_blocks;
  auto runner = ModelRunner::FromModule(std::move(model), options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return std::move(runner).value();
}

SequenceChunk Chunk(SeqId seq, std::vector<int32_t> tokens, LogitsRows logits = LogitsRows::kLast) {
  SequenceChunk c;
  c.seq = seq;
  c.tokens = std::move(tokens);
  c.logits = logits;
  return c;
}

torch::Tensor ForwardOne(ModelRunner& runner, const SequenceChunk& chunk) {
  ForwardBatch batch;
  batch.seqs.push_back(chunk);
  auto out = runner.Forward(batch);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? out->logits : torch::Tensor();
}

// Dense (no cache) logits for every position of `tokens`.
torch::Tensor DenseLogits(CausalLMImpl& model, const std::vector<int32_t>& tokens) {
  torch::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto t = torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), torch::kLong);
  auto in = model.DenseCausalInputs(1, n, torch::arange(n, torch::kLong));
  return model.Logits(model.forward(t, in, nullptr).last_hidden);
}

void ExpectClose(const torch::Tensor& a, const torch::Tensor& b, double tol,
                 const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double diff = (a - b).abs().max().item<double>();
  EXPECT_LE(diff, tol) << what << ": max |diff| = " << diff;
}

const std::vector<int32_t> kPrefix = {5, 17, 33, 2, 48};
// A candidate tree of 7 nodes:  0 -> 2 -> 4 -> 6,  0 -> 3,  1 -> 5.
const std::vector<int32_t> kTreeTokens = {10, 11, 12, 13, 14, 15, 16};
const std::vector<int32_t> kTreeParents = {-1, -1, 0, 0, 2, 1, 4};
const std::vector<int32_t> kTreeDepth = {0, 0, 1, 1, 2, 1, 3};

SequenceChunk TreeChunk(SeqId seq) {
  SequenceChunk c = Chunk(seq, kTreeTokens, LogitsRows::kAll);
  c.parents = kTreeParents;
  for (int32_t d : kTreeDepth) c.positions.push_back(static_cast<int32_t>(kPrefix.size()) + d);
  return c;
}

class TreeCommitTest : public ::testing::TestWithParam<std::vector<int64_t>> {};

TEST_P(TreeCommitTest, CommittedPathEqualsDecodingThePathAlone) {
  const std::vector<int64_t> path = GetParam();
  auto model = MakeModel(TinyModelConfig(), 3);
  auto runner = MakeRunner(model, 32);
  const SeqId a = 1, b = 2;
  const int64_t prefix_len = static_cast<int64_t>(kPrefix.size());
  ASSERT_TRUE(runner->AddSequence(a).ok());
  ASSERT_TRUE(runner->AddSequence(b).ok());
  ForwardOne(*runner, Chunk(a, kPrefix));
  ForwardOne(*runner, Chunk(b, kPrefix));

  // A: verify the whole tree in one forward.
  torch::Tensor tree_logits = ForwardOne(*runner, TreeChunk(a));
  ASSERT_EQ(tree_logits.size(0), static_cast<int64_t>(kTreeTokens.size()));
  EXPECT_EQ(runner->SequenceLength(a), prefix_len + static_cast<int64_t>(kTreeTokens.size()));

  // B: decode the path one token at a time; each step's logits equal the tree node's row.
  std::vector<int32_t> accepted = kPrefix;
  for (int64_t node : path) {
    accepted.push_back(kTreeTokens[node]);
    torch::Tensor step = ForwardOne(*runner, Chunk(b, {kTreeTokens[node]}));
    ExpectClose(step, tree_logits[node].unsqueeze(0), 1e-5, "tree row " + std::to_string(node));
  }

  ASSERT_TRUE(runner->KeepOnly(a, prefix_len, path).ok());
  EXPECT_EQ(runner->SequenceLength(a), runner->SequenceLength(b));
  EXPECT_EQ(runner->SequenceLength(a), prefix_len + static_cast<int64_t>(path.size()));
  const int64_t blocks = (runner->SequenceLength(a) + kBlock - 1) / kBlock;
  EXPECT_EQ(runner->kv_stats().free_blocks, 32 - 2 * blocks);

  // Continue both with the same tokens: same logits, equal to the dense reference.
  for (int32_t next : {7, 9, 21}) {
    accepted.push_back(next);
    torch::Tensor la = ForwardOne(*runner, Chunk(a, {next}));
    torch::Tensor lb = ForwardOne(*runner, Chunk(b, {next}));
    ExpectClose(la, lb, 1e-5, "next token " + std::to_string(next));
    torch::Tensor dense = DenseLogits(*model, accepted);
    ExpectClose(la, dense[-1].unsqueeze(0), 1e-5, "dense reference");
  }
  EXPECT_EQ(runner->SequenceLength(a), runner->SequenceLength(b));
}

INSTANTIATE_TEST_SUITE_P(Paths, TreeCommitTest,
                         ::testing::Values(std::vector<int64_t>{0, 2, 4, 6},
                                           std::vector<int64_t>{1, 5}, std::vector<int64_t>{0, 3},
                                           std::vector<int64_t>{1}, std::vector<int64_t>{}));

// The check above can fail: truncating instead of compacting keeps the wrong rows, and the next
// token's logits then differ far beyond the tolerance.
TEST(TreeCommitSensitivityTest, TruncateWithoutCompactionChangesLogits) {
  auto model = MakeModel(TinyModelConfig(), 3);
  auto runner = MakeRunner(model, 32);
  const int64_t prefix_len = static_cast<int64_t>(kPrefix.size());
  const std::vector<int64_t> path = {1, 5};
  for (SeqId s : {1, 2}) {
    ASSERT_TRUE(runner->AddSequence(s).ok());
    ForwardOne(*runner, Chunk(s, kPrefix));
    ForwardOne(*runner, TreeChunk(s));
  }
  ASSERT_TRUE(runner->KeepOnly(1, prefix_len, path).ok());
  ASSERT_TRUE(runner->Truncate(2, prefix_len + 2).ok());  // keeps nodes 0, 1: wrong
  torch::Tensor right = ForwardOne(*runner, Chunk(1, {7}));
  torch::Tensor wrong = ForwardOne(*runner, Chunk(2, {7}));
  EXPECT_GT((right - wrong).abs().max().item<double>(), 1e-3);
}

// ... and the tree mask matters: node 1 hangs off the prefix, so its row differs from the same
// tokens run as a chain (where node 1 would also see node 0).
TEST(TreeCommitSensitivityTest, TreeRowsDifferFromAChain) {
  auto model = MakeModel(TinyModelConfig(), 3);
  auto runner = MakeRunner(model, 32);
  for (SeqId s : {1, 2}) {
    ASSERT_TRUE(runner->AddSequence(s).ok());
    ForwardOne(*runner, Chunk(s, kPrefix));
  }
  torch::Tensor tree = ForwardOne(*runner, TreeChunk(1));
  torch::Tensor chain =
      ForwardOne(*runner, Chunk(2, {kTreeTokens[0], kTreeTokens[1]}, LogitsRows::kAll));
  ExpectClose(tree[0], chain[0], 1e-5, "node 0");
  EXPECT_GT((tree[1] - chain[1]).abs().max().item<double>(), 1e-3);
}

// Several sequences in one verification batch, each committing a different path.
TEST(TreeCommitBatchTest, BatchedTreesCommitIndependently) {
  auto model = MakeModel(TinyModelConfig(), 5);
  auto runner = MakeRunner(model, 32);
  const int64_t prefix_len = static_cast<int64_t>(kPrefix.size());
  const std::vector<std::vector<int64_t>> paths = {{0, 2, 4}, {1, 5}};
  for (SeqId s : {1, 2}) {
    ASSERT_TRUE(runner->AddSequence(s).ok());
    ForwardOne(*runner, Chunk(s, kPrefix));
  }
  ForwardBatch batch;
  batch.seqs = {TreeChunk(1), TreeChunk(2)};
  auto out = runner->Forward(batch);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->logits_offset, (std::vector<int64_t>{0, 7, 14}));
  EXPECT_EQ(out->token_offset, (std::vector<int64_t>{0, 7, 14}));
  for (SeqId s : {1, 2}) {
    ASSERT_TRUE(runner->KeepOnly(s, prefix_len, paths[s - 1]).ok());
    std::vector<int32_t> accepted = kPrefix;
    for (int64_t node : paths[s - 1]) accepted.push_back(kTreeTokens[node]);
    accepted.push_back(30);
    torch::Tensor next = ForwardOne(*runner, Chunk(s, {30}));
    ExpectClose(next, DenseLogits(*model, accepted)[-1].unsqueeze(0), 1e-5,
                "sequence " + std::to_string(s));
  }
}

}  // namespace
}  // namespace specula
