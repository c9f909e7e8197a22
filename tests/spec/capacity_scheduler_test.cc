// CapacityScheduler: the admission rule SpecEngine and the router's EngineLoop share (batch room,
// KV block reservations, FIFO without overtaking) and its errors.
#include "common/spec/capacity_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace specula {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

// 4-token blocks, a 64-position context.
CapacityLimits Limits(int32_t batch, int64_t blocks) {
  return {
      .max_batch_size = batch, .kv_cache_blocks = blocks, .kv_block_size = 4, .context_length = 64};
}

// A request that reserves prompt + max_new_tokens + draft + 1 positions.
SpecRequest Request(int64_t prompt, int64_t max_new, int32_t draft = 0) {
  SpecRequest r;
  r.generation.prompt.assign(prompt, 7);
  r.generation.max_new_tokens = max_new;
  if (draft > 0) {
    r.speculation.drafter = "d";
    r.speculation.max_draft_tokens = draft;
  }
  return r;
}

TEST(CapacitySchedulerTest, ReservesWhatKvBlocksReservedSaysIncludingTheDraftCap) {
  CapacityScheduler s(Limits(8, 100));
  EXPECT_EQ(s.BlocksFor(Request(3, 4)), 2);         // 8 positions
  EXPECT_EQ(s.BlocksFor(Request(3, 4, 16)), 6);     // + a 16-node draft: 24 positions
  EXPECT_EQ(s.BlocksFor(Request(50, 100, 4)), 16);  // capped at the 64-position context
  const SpecRequest r = Request(10, 20, 5);
  EXPECT_EQ(s.BlocksFor(r), KvBlocksReserved(r, 4, 64));
  // A request whose drafter is "none" reserves no draft room.
  SpecRequest off = Request(3, 4, 16);
  off.speculation.drafter = "none";
  EXPECT_EQ(s.BlocksFor(off), 2);
}

TEST(CapacitySchedulerTest, TheBatchLimitHoldsRequestsBack) {
  CapacityScheduler s(Limits(2, 100));
  for (RequestId id : {1, 2, 3}) ASSERT_TRUE(s.Enqueue(id, Request(3, 4)).ok());
  for (RequestId id : {1, 2}) {
    EXPECT_THAT(s.NextAdmissible(), Optional(id));
    ASSERT_TRUE(s.Admit(id).ok());
  }
  EXPECT_EQ(s.NextAdmissible(), std::nullopt);  // blocks are free, the batch is full
  const Status full = s.Admit(3);
  EXPECT_EQ(full.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(full.message(), HasSubstr("the batch holds 2"));
  EXPECT_EQ(s.num_running(), 2);
  EXPECT_EQ(s.num_waiting(), 1);
  EXPECT_EQ(s.reserved_blocks(), 4);
  EXPECT_EQ(s.free_blocks(), 96);
}

TEST(CapacitySchedulerTest, TheBlockBudgetHoldsRequestsBack) {
  CapacityScheduler s(Limits(8, 5));
  ASSERT_TRUE(s.Enqueue(1, Request(3, 8)).ok());  // 12 positions: 3 blocks
  ASSERT_TRUE(s.Enqueue(2, Request(3, 8)).ok());
  ASSERT_TRUE(s.Admit(1).ok());
  EXPECT_EQ(s.reserved_blocks(), 3);
  EXPECT_EQ(s.free_blocks(), 2);
  EXPECT_EQ(s.NextAdmissible(), std::nullopt);  // 3 + 3 > 5
  const Status no_room = s.Admit(2);
  EXPECT_EQ(no_room.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_room.message(), HasSubstr("needs 3 KV blocks and 2 of 5 are free"));
  EXPECT_TRUE(s.IsWaiting(2));
  EXPECT_FALSE(s.IsRunning(2));
}

TEST(CapacitySchedulerTest, AdmitsInOrderWithoutOvertaking) {
  CapacityScheduler s(Limits(8, 10));
  ASSERT_TRUE(s.Enqueue(1, Request(3, 20)).ok());  // 24 positions: 6 blocks
  ASSERT_TRUE(s.Enqueue(2, Request(3, 24)).ok());  // 28: 7 blocks, does not fit next to 1
  ASSERT_TRUE(s.Enqueue(3, Request(1, 2)).ok());   // 4: 1 block, would fit
  ASSERT_TRUE(s.Admit(1).ok());
  // The small request waits behind the head that does not fit.
  EXPECT_EQ(s.NextAdmissible(), std::nullopt);
  const Status overtake = s.Admit(3);
  EXPECT_EQ(overtake.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(overtake.message(), HasSubstr("not at the head of the queue (request 2 is)"));
  EXPECT_FALSE(s.IsRunning(3));
  // Once the head fits, both follow in order.
  ASSERT_TRUE(s.Release(1).ok());
  EXPECT_THAT(s.NextAdmissible(), Optional(RequestId{2}));
  ASSERT_TRUE(s.Admit(2).ok());
  EXPECT_THAT(s.NextAdmissible(), Optional(RequestId{3}));
  ASSERT_TRUE(s.Admit(3).ok());
  EXPECT_EQ(s.reserved_blocks(), 8);
}

TEST(CapacitySchedulerTest, ReleaseFreesRoomAndLeavesTheQueue) {
  CapacityScheduler s(Limits(1, 100));
  ASSERT_TRUE(s.Enqueue(1, Request(3, 4)).ok());
  ASSERT_TRUE(s.Enqueue(2, Request(3, 4)).ok());
  ASSERT_TRUE(s.Enqueue(3, Request(3, 4)).ok());
  ASSERT_TRUE(s.Admit(1).ok());
  EXPECT_EQ(s.NextAdmissible(), std::nullopt);
  // A waiting request that leaves (cancelled) leaves the queue: the next one becomes the head.
  ASSERT_TRUE(s.Release(2).ok());
  EXPECT_FALSE(s.IsWaiting(2));
  EXPECT_EQ(s.num_waiting(), 1);
  // A running one frees its batch slot and blocks.
  ASSERT_TRUE(s.Release(1).ok());
  EXPECT_EQ(s.num_running(), 0);
  EXPECT_EQ(s.reserved_blocks(), 0);
  EXPECT_EQ(s.free_blocks(), 100);
  EXPECT_THAT(s.NextAdmissible(), Optional(RequestId{3}));
  ASSERT_TRUE(s.Admit(3).ok());
}

TEST(CapacitySchedulerTest, ARequestLargerThanTheCacheIsRefusedNamingTheNumbers) {
  CapacityScheduler s(Limits(8, 5));
  const SpecRequest big = Request(10, 30, 4);  // 45 positions: 12 blocks
  const Status never = s.CheckFits(big);
  EXPECT_EQ(never.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(never.message(), HasSubstr("needs 12 KV blocks"));
  EXPECT_THAT(never.message(), HasSubstr("the cache has 5"));
  EXPECT_EQ(s.Enqueue(1, big), never);
  EXPECT_FALSE(s.IsWaiting(1));
  EXPECT_EQ(s.NextAdmissible(), std::nullopt);
  // Exactly the whole cache fits.
  EXPECT_TRUE(s.CheckFits(Request(3, 16)).ok());  // 20 positions: 5 blocks
}

TEST(CapacitySchedulerTest, MisuseIsAnErrorNotACrash) {
  CapacityScheduler s(Limits(8, 100));
  ASSERT_TRUE(s.Enqueue(1, Request(3, 4)).ok());
  EXPECT_EQ(s.Enqueue(1, Request(3, 4)).code(), StatusCode::kAlreadyExists);  // waiting
  ASSERT_TRUE(s.Admit(1).ok());
  const Status twice = s.Admit(1);
  EXPECT_EQ(twice.code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(twice.message(), HasSubstr("request 1 is already running"));
  EXPECT_EQ(s.Enqueue(1, Request(3, 4)).code(), StatusCode::kAlreadyExists);  // running
  EXPECT_EQ(s.Admit(7).code(), StatusCode::kNotFound);
  const Status unknown = s.Release(7);
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("request 7"));
  ASSERT_TRUE(s.Release(1).ok());
  EXPECT_EQ(s.Release(1).code(), StatusCode::kNotFound);  // released already
  // The counters are untouched by the errors.
  EXPECT_EQ(s.num_running(), 0);
  EXPECT_EQ(s.num_waiting(), 0);
  EXPECT_EQ(s.reserved_blocks(), 0);
}

TEST(CapacitySchedulerTest, ABatchLimitBelowOneAdmitsNothing) {
  CapacityScheduler s(Limits(0, 100));
  ASSERT_TRUE(s.Enqueue(1, Request(3, 4)).ok());
  EXPECT_EQ(s.NextAdmissible(), std::nullopt);
  EXPECT_EQ(s.Admit(1).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace specula
