#include "common/kv/block_allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<int64_t> AppendOk(BlockAllocator& alloc, SeqId seq, int64_t n) {
  auto slots = alloc.Append(seq, n);
  EXPECT_TRUE(slots.ok()) << slots.status();
  return slots.ok() ? *slots : std::vector<int64_t>{};
}

TEST(BlockAllocatorTest, SlotIdsAreBlockTimesSizePlusOffset) {
  BlockAllocator alloc(/*num_blocks=*/4, /*block_size=*/4);
  EXPECT_EQ(alloc.num_blocks(), 4);
  EXPECT_EQ(alloc.block_size(), 4);
  EXPECT_EQ(alloc.num_free_blocks(), 4);
  ASSERT_TRUE(alloc.AddSequence(1).ok());
  ASSERT_TRUE(alloc.AddSequence(2).ok());
  EXPECT_EQ(alloc.num_sequences(), 2);

  // Fresh blocks are handed out lowest id first.
  EXPECT_THAT(AppendOk(alloc, 1, 3), ElementsAre(0, 1, 2));
  EXPECT_THAT(AppendOk(alloc, 2, 1), ElementsAre(4));  // block 1
  // Seq 1 fills its block 0, then continues in block 2.
  EXPECT_THAT(AppendOk(alloc, 1, 3), ElementsAre(3, 8, 9));
  EXPECT_EQ(alloc.Length(1), 6);
  EXPECT_EQ(alloc.Length(2), 1);
  EXPECT_THAT(alloc.Slots(1), ElementsAre(0, 1, 2, 3, 8, 9));
  EXPECT_THAT(alloc.Slots(2), ElementsAre(4));
  EXPECT_EQ(alloc.SlotOf(1, 4), 8);
  EXPECT_EQ(alloc.SlotOf(1, 3), 3);
  EXPECT_EQ(alloc.SlotOf(2, 0), 4);
  EXPECT_EQ(alloc.num_free_blocks(), 1);

  // Appending zero positions is a no-op.
  EXPECT_THAT(AppendOk(alloc, 2, 0), IsEmpty());
  EXPECT_EQ(alloc.Length(2), 1);
  EXPECT_EQ(alloc.num_free_blocks(), 1);
}

TEST(BlockAllocatorTest, AddAndFreeErrors) {
  BlockAllocator alloc(2, 4);
  ASSERT_TRUE(alloc.AddSequence(7).ok());
  Status dup = alloc.AddSequence(7);
  EXPECT_EQ(dup.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(dup.message(), "sequence 7 already exists");

  Status unknown = alloc.FreeSequence(8);
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_EQ(unknown.message(), "unknown sequence 8");

  auto append_unknown = alloc.Append(8, 1);
  EXPECT_EQ(append_unknown.status().code(), StatusCode::kNotFound);
  auto append_negative = alloc.Append(7, -1);
  EXPECT_EQ(append_negative.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc.Length(7), 0);

  EXPECT_EQ(alloc.Truncate(8, 0).code(), StatusCode::kNotFound);
  EXPECT_FALSE(alloc.HasSequence(8));
  EXPECT_EQ(alloc.Length(8), 0);
  EXPECT_THAT(alloc.Slots(8), IsEmpty());

  ASSERT_TRUE(alloc.FreeSequence(7).ok());
  EXPECT_FALSE(alloc.HasSequence(7));
  EXPECT_EQ(alloc.num_sequences(), 0);
  EXPECT_EQ(alloc.FreeSequence(7).code(), StatusCode::kNotFound);
}

TEST(BlockAllocatorTest, BlocksNeeded) {
  BlockAllocator alloc(8, 4);
  // Unknown sequences count from zero.
  EXPECT_EQ(alloc.BlocksNeeded(99, 0), 0);
  EXPECT_EQ(alloc.BlocksNeeded(99, 1), 1);
  EXPECT_EQ(alloc.BlocksNeeded(99, 4), 1);
  EXPECT_EQ(alloc.BlocksNeeded(99, 5), 2);
  ASSERT_TRUE(alloc.AddSequence(1).ok());
  EXPECT_EQ(alloc.BlocksNeeded(1, 9), 3);
  AppendOk(alloc, 1, 5);  // 2 blocks, 3 free positions in the last one
  EXPECT_EQ(alloc.BlocksNeeded(1, 0), 0);
  EXPECT_EQ(alloc.BlocksNeeded(1, 3), 0);
  EXPECT_EQ(alloc.BlocksNeeded(1, 4), 1);
  EXPECT_EQ(alloc.BlocksNeeded(1, 7), 1);
  EXPECT_EQ(alloc.BlocksNeeded(1, 8), 2);
  EXPECT_EQ(alloc.num_free_blocks(), 6);
}

TEST(BlockAllocatorTest, AppendIsAllOrNothingOnExhaustion) {
  BlockAllocator alloc(4, 4);
  ASSERT_TRUE(alloc.AddSequence(1).ok());
  ASSERT_TRUE(alloc.AddSequence(2).ok());
  AppendOk(alloc, 1, 8);  // blocks 0, 1
  AppendOk(alloc, 2, 1);  // block 2
  ASSERT_EQ(alloc.num_free_blocks(), 1);
  const std::vector<int64_t> slots_before = alloc.Slots(2);

  // 1 + 8 positions need 3 blocks; seq 2 has 1 and only 1 is free.
  auto full = alloc.Append(2, 8);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(full.status().message(),
            "KV cache full: sequence 2 needs 2 more blocks of 4 positions, 1 of 4 are free");
  EXPECT_EQ(alloc.Length(2), 1);
  EXPECT_EQ(alloc.Slots(2), slots_before);
  EXPECT_EQ(alloc.num_free_blocks(), 1);

  // What still fits does succeed: 1 + 7 = 8 positions = 2 blocks.
  EXPECT_THAT(AppendOk(alloc, 2, 7), ElementsAre(9, 10, 11, 12, 13, 14, 15));
  EXPECT_EQ(alloc.num_free_blocks(), 0);
  // Positions left in a block need no new block even when none is free.
  ASSERT_TRUE(alloc.AddSequence(3).ok());
  EXPECT_EQ(alloc.Append(3, 1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(alloc.Length(3), 0);
  EXPECT_EQ(alloc.num_sequences(), 3);
}

TEST(BlockAllocatorTest, AppendAllIsAllOrNothingAcrossSequences) {
  BlockAllocator a(/*num_blocks=*/4, /*block_size=*/4);
  ASSERT_TRUE(a.AddSequence(1).ok());
  ASSERT_TRUE(a.AddSequence(2).ok());
  ASSERT_TRUE(a.Append(1, 3).ok());
  // 1 grows by 2 (one more block), 2 by 9 (three blocks): 4 > the 3 free blocks.
  auto full = a.AppendAll({{1, 2}, {2, 9}});
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a.Length(1), 3);
  EXPECT_EQ(a.Length(2), 0);
  EXPECT_EQ(a.num_free_blocks(), 3);
  EXPECT_EQ(a.AppendAll({{1, 1}, {1, 1}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.AppendAll({{1, 1}, {7, 1}}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(a.AppendAll({{1, -1}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Length(1), 3);
  auto ok = a.AppendAll({{1, 2}, {2, 5}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0], (std::vector<int64_t>{a.SlotOf(1, 3), a.SlotOf(1, 4)}));
  EXPECT_EQ((*ok)[1].size(), 5u);
  EXPECT_EQ(a.Length(1), 5);
  EXPECT_EQ(a.Length(2), 5);
  EXPECT_EQ(a.num_free_blocks(), 0);
}

TEST(BlockAllocatorTest, FreedBlocksAreReusedMostRecentFirst) {
  BlockAllocator alloc(4, 4);
  ASSERT_TRUE(alloc.AddSequence(1).ok());
  ASSERT_TRUE(alloc.AddSequence(2).ok());
  AppendOk(alloc, 1, 2);  // block 0
  AppendOk(alloc, 2, 4);  // block 1
  AppendOk(alloc, 1, 4);  // block 2 (positions 2, 3 in block 0; 4, 5 in block 2)
  EXPECT_THAT(alloc.Slots(1), ElementsAre(0, 1, 2, 3, 8, 9));
  ASSERT_EQ(alloc.num_free_blocks(), 1);

  ASSERT_TRUE(alloc.FreeSequence(1).ok());
  EXPECT_EQ(alloc.num_free_blocks(), 3);
  // A new sequence gets seq 1's blocks back, in seq 1's order, before the never-used block 3.
  ASSERT_TRUE(alloc.AddSequence(3).ok());
  EXPECT_THAT(AppendOk(alloc, 3, 9), ElementsAre(0, 1, 2, 3, 8, 9, 10, 11, 12));
  EXPECT_EQ(alloc.num_free_blocks(), 0);
  // The released id can be added again.
  ASSERT_TRUE(alloc.AddSequence(1).ok());
  EXPECT_EQ(alloc.Length(1), 0);
}

TEST(BlockAllocatorTest, TruncateReleasesWholeBlocksOnly) {
  BlockAllocator alloc(4, 4);
  ASSERT_TRUE(alloc.AddSequence(1).ok());
  AppendOk(alloc, 1, 10);  // blocks 0, 1, 2
  ASSERT_EQ(alloc.num_free_blocks(), 1);

  ASSERT_TRUE(alloc.Truncate(1, 9).ok());  // still 3 blocks
  EXPECT_EQ(alloc.num_free_blocks(), 1);
  EXPECT_EQ(alloc.Length(1), 9);
  ASSERT_TRUE(alloc.Truncate(1, 8).ok());  // 2 blocks
  EXPECT_EQ(alloc.num_free_blocks(), 2);
  ASSERT_TRUE(alloc.Truncate(1, 4).ok());  // 1 block
  EXPECT_EQ(alloc.num_free_blocks(), 3);
  EXPECT_THAT(alloc.Slots(1), ElementsAre(0, 1, 2, 3));

  Status grow = alloc.Truncate(1, 5);
  EXPECT_EQ(grow.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(grow.message(), "cannot truncate sequence 1 of length 4 to 5");
  EXPECT_EQ(alloc.Truncate(1, -1).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(alloc.Length(1), 4);

  // Growing again reuses the block released last (block 1).
  EXPECT_THAT(AppendOk(alloc, 1, 2), ElementsAre(4, 5));
  ASSERT_TRUE(alloc.Truncate(1, 0).ok());
  EXPECT_TRUE(alloc.HasSequence(1));
  EXPECT_EQ(alloc.Length(1), 0);
  EXPECT_EQ(alloc.num_free_blocks(), 4);
  EXPECT_THAT(alloc.Slots(1), IsEmpty());
}

}  // namespace
}  // namespace specula
