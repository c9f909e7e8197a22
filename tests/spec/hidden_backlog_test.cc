#include "common/spec/hidden_backlog.h"
#include "common/spec/hidden_row_store.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>

namespace specula {
namespace {

// Two layers of a packed step: [rows, hidden], row r of layer k filled with 100 k + r.
std::vector<at::Tensor> StepLayers(int64_t rows, int64_t hidden, int64_t first = 0) {
  std::vector<at::Tensor> layers;
  for (int64_t k = 0; k < 2; ++k) {
    at::Tensor rowid = at::arange(first, first + rows, at::kFloat).unsqueeze(1);
    layers.push_back((rowid + 100.0 * k).expand({rows, hidden}).contiguous());
  }
  return layers;
}

// The rows appended, per layer, as the values each row was filled with.
std::vector<std::vector<float>> RowIds(const std::vector<at::Tensor>& taken) {
  std::vector<std::vector<float>> ids;
  for (const at::Tensor& t : taken) {
    std::vector<float> v;
    for (int64_t r = 0; r < t.size(0); ++r) {
      EXPECT_TRUE(at::equal(t[r], at::full_like(t[r], t[r][0].item<float>())));
      v.push_back(t[r][0].item<float>());
    }
    ids.push_back(v);
  }
  return ids;
}

TEST(HiddenBacklogTest, KeepsRangesAndRowsInOrderAcrossGrowth) {
  HiddenBacklog backlog;
  backlog.AppendRange(StepLayers(40, 8), 3, 33);  // a prompt chunk: rows 3..32
  for (int step = 0; step < 20; ++step) {         // then accepted paths, past the buffer's size
    backlog.AppendRows(StepLayers(6, 8, 1000 + 10 * step), {0, 2, 5});
  }
  EXPECT_EQ(backlog.rows(), 30 + 60);
  const auto ids = RowIds(backlog.Take());
  ASSERT_EQ(ids.size(), 2u);
  std::vector<float> want;
  for (int r = 3; r < 33; ++r) want.push_back(r);
  for (int step = 0; step < 20; ++step) {
    for (int r : {0, 2, 5}) want.push_back(1000 + 10 * step + r);
  }
  EXPECT_EQ(ids[0], want);
  for (float& w : want) w += 100;
  EXPECT_EQ(ids[1], want);
  EXPECT_EQ(backlog.rows(), 0);
  EXPECT_TRUE(backlog.Take().empty());
}

// Shared rows (kept, not copied) mixed with copied ones, in any order between Takes: a prompt
// chunk, shared decode rows, a copied step (which copies the shared rows first), shared again.
TEST(HiddenBacklogTest, SharedRowsComeBackInOrderWithCopiedOnes) {
  HiddenBacklog backlog;
  auto shared = [](int64_t rows, int64_t first) {
    return std::make_shared<const std::vector<at::Tensor>>(StepLayers(rows, 8, first));
  };
  backlog.AppendRange(StepLayers(40, 8), 3, 13);  // rows 3..12
  for (int step = 0; step < 5; ++step) backlog.AppendShared(shared(4, 1000 + 10 * step), {1, 3});
  backlog.AppendRows(StepLayers(6, 8, 2000), {0, 5});
  const auto kept = shared(3, 3000);
  backlog.AppendShared(kept, {2});
  backlog.AppendShared(kept, {0});
  EXPECT_EQ(backlog.rows(), 10 + 10 + 2 + 2);
  std::vector<float> want;
  for (int r = 3; r < 13; ++r) want.push_back(r);
  for (int step = 0; step < 5; ++step) {
    for (int r : {1, 3}) want.push_back(1000 + 10 * step + r);
  }
  for (float r : {2000, 2005, 3002, 3000}) want.push_back(r);
  const auto ids = RowIds(backlog.Take());
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0], want);
  for (float& w : want) w += 100;
  EXPECT_EQ(ids[1], want);
  EXPECT_EQ(backlog.rows(), 0);
  // Only shared rows; then a fresh start that a Clear also gives.
  backlog.AppendShared(shared(2, 7), {1, 0});
  EXPECT_EQ(RowIds(backlog.Take())[0], (std::vector<float>{8, 7}));
  backlog.AppendShared(shared(2, 7), {1});
  backlog.Clear();
  EXPECT_EQ(backlog.rows(), 0);
  EXPECT_TRUE(backlog.Take().empty());
  EXPECT_THROW(backlog.AppendShared(shared(2, 0), {2}), c10::Error);  // outside the step
}

TEST(HiddenBacklogTest, TakenRowsStayValidAfterNewAppends) {
  HiddenBacklog backlog;
  backlog.AppendRows(StepLayers(4, 8), {1, 3});
  const auto first = backlog.Take();
  backlog.AppendRows(StepLayers(4, 8, 50), {0, 1, 2, 3});  // must not write into `first`
  EXPECT_EQ(RowIds(first)[0], (std::vector<float>{1, 3}));
  EXPECT_EQ(RowIds(backlog.Take())[0], (std::vector<float>{50, 51, 52, 53}));
}

TEST(HiddenBacklogTest, ExpectRowsSizesTheFirstBuffersAndATakenBufferIsReusedOnceLetGo) {
  HiddenBacklog backlog;
  backlog.ExpectRows(/*first=*/64, /*later=*/32);
  backlog.AppendRange(StepLayers(40, 8), 0, 40);  // a prompt
  for (int step = 0; step < 20; ++step) backlog.AppendRows(StepLayers(2, 8, 100 + step), {1});
  std::vector<at::Tensor> first = backlog.Take();
  ASSERT_EQ(first.size(), 2u);
  // One buffer per layer, of the expected rows: nothing grew (a buffer of 40 would have).
  EXPECT_EQ(first[0].storage().nbytes(), 64u * 8 * sizeof(float));
  EXPECT_EQ(RowIds(first)[0].back(), 100 + 19 + 1);
  void* const buffer = first[0].data_ptr();
  first.clear();  // the drafter copied what it observed
  backlog.AppendRows(StepLayers(3, 8, 500), {2, 0});
  std::vector<at::Tensor> second = backlog.Take();
  EXPECT_EQ(second[0].data_ptr(), buffer) << "a buffer nobody views was not reused";
  EXPECT_EQ(RowIds(second)[0], (std::vector<float>{502, 500}));
  EXPECT_EQ(RowIds(second)[1], (std::vector<float>{602, 600}));
  // Held views are never written: the next rows go to a new buffer, sized as needed.
  backlog.AppendRows(StepLayers(2, 8, 700), {0});
  EXPECT_EQ(RowIds(second)[0], (std::vector<float>{502, 500}));
  std::vector<at::Tensor> third = backlog.Take();
  EXPECT_NE(third[0].data_ptr(), buffer);
  EXPECT_EQ(third[0].storage().nbytes(), 32u * 8 * sizeof(float)) << "not sized for `later`";
  EXPECT_EQ(RowIds(third)[0], (std::vector<float>{700}));
}

TEST(HiddenBacklogTest, APromptSizedBufferIsLetGoAtATake) {
  HiddenBacklog backlog;
  backlog.ExpectRows(/*first=*/200, /*later=*/20);
  backlog.AppendRange(StepLayers(150, 4), 0, 150);
  std::vector<at::Tensor> prompt = backlog.Take();
  EXPECT_EQ(prompt[0].storage().nbytes(), 200u * 4 * sizeof(float));
  prompt.clear();  // nobody views it: still not kept, 200 rows are more than twice 20
  backlog.AppendRows(StepLayers(2, 4, 300), {1});
  std::vector<at::Tensor> next = backlog.Take();
  EXPECT_EQ(next[0].storage().nbytes(), 20u * 4 * sizeof(float));
  EXPECT_EQ(RowIds(next)[1], (std::vector<float>{401}));
}

TEST(HiddenBacklogTest, NonContiguousAndContiguousStepsMix) {
  HiddenBacklog backlog;
  std::vector<at::Tensor> strided;
  for (const at::Tensor& t : StepLayers(8, 6)) strided.push_back(t.t().contiguous().t());
  ASSERT_FALSE(strided[0].is_contiguous());
  backlog.AppendRange(strided, 0, 2);
  backlog.AppendRows(StepLayers(8, 6, 20), {7});
  EXPECT_EQ(RowIds(backlog.Take())[1], (std::vector<float>{100, 101, 127}));
}

TEST(HiddenBacklogTest, StridedStepsOverManyAppendsComeBackInOrder) {
  // Strided step tensors are copied into the same buffers, across growth.
  HiddenBacklog backlog;
  std::vector<float> want;
  const int steps = 39;
  for (int step = 0; step < steps; ++step) {
    std::vector<at::Tensor> strided;
    for (const at::Tensor& t : StepLayers(3, 5, 10 * step))
      strided.push_back(t.t().contiguous().t());
    backlog.AppendRows(strided, {2, 1});
    want.push_back(10 * step + 2);
    want.push_back(10 * step + 1);
  }
  EXPECT_EQ(backlog.rows(), 2 * steps);
  EXPECT_EQ(RowIds(backlog.Take())[0], want);
}

TEST(HiddenBacklogTest, RowsOutsideTheStepOrNotRowsAreRefused) {
  HiddenBacklog backlog;
  EXPECT_THROW(backlog.AppendRows(StepLayers(4, 3), {1, 4}), c10::Error);
  EXPECT_THROW(backlog.AppendRange({at::ones({4})}, 0, 2), c10::Error);  // not [rows, hidden]
}

// KeepNewest drops the oldest rows wherever they are: all of the buffers' and some shared
// ones, some of the buffers' (the rest move to the front), or none; later appends follow.
TEST(HiddenBacklogTest, KeepNewestLetsGoOfTheOldestRows) {
  auto shared = [](int64_t rows, int64_t first) {
    return std::make_shared<const std::vector<at::Tensor>>(StepLayers(rows, 8, first));
  };
  auto ids = [](std::vector<float> v, float plus = 0) {
    for (float& x : v) x += plus;
    return v;
  };
  HiddenBacklog backlog;
  backlog.AppendRange(StepLayers(40, 8), 3, 13);  // buffered rows 3..12
  for (int step = 0; step < 3; ++step) backlog.AppendShared(shared(4, 1000 + 10 * step), {1});
  backlog.KeepNewest(2);  // every buffered row and the first shared one go
  EXPECT_EQ(backlog.rows(), 2);
  backlog.AppendShared(shared(4, 2000), {3});
  auto taken = RowIds(backlog.Take());
  EXPECT_EQ(taken[0], ids({1011, 1021, 2003}));
  EXPECT_EQ(taken[1], ids({1011, 1021, 2003}, 100));

  backlog.AppendRange(StepLayers(40, 8), 0, 30);  // rows 0..29
  backlog.AppendShared(shared(2, 500), {0, 1});
  backlog.KeepNewest(5);  // buffered rows 27..29 move to the front, both shared rows stay
  EXPECT_EQ(backlog.rows(), 5);
  backlog.AppendRows(StepLayers(3, 8, 700), {2});
  taken = RowIds(backlog.Take());
  EXPECT_EQ(taken[0], ids({27, 28, 29, 500, 501, 702}));
  EXPECT_EQ(taken[1], ids({27, 28, 29, 500, 501, 702}, 100));

  backlog.AppendRows(StepLayers(3, 8), {0, 1});
  backlog.KeepNewest(7);  // fewer rows than that: nothing changes
  backlog.KeepNewest(-1);
  EXPECT_EQ(backlog.rows(), 0);
  EXPECT_TRUE(backlog.Take().empty());
}

TEST(HiddenRowStoreTest, KeepNewestFreesTheDroppedSlots) {
  HiddenRowStore store;
  HiddenBacklog backlog;
  const std::vector<int64_t> slots = store.Put({0}, {StepLayers(5, 3)[0]}, {0, 1, 2, 3, 4});
  backlog.AppendSlots(&store, {0}, slots);
  backlog.KeepNewest(2);
  EXPECT_EQ(backlog.rows(), 2);
  EXPECT_EQ(store.held(), 2);
  EXPECT_EQ(RowIds(backlog.Take())[0], (std::vector<float>{3, 4}));
  EXPECT_EQ(store.held(), 0);
}

TEST(HiddenRowStoreTest, StepsOfManySequencesGoInAndComeBackInOrder) {
  HiddenRowStore store;
  HiddenBacklog a, b;
  const std::vector<int64_t> ids = {2, 5};  // model layers of the step's two tensors
  std::vector<float> want_a, want_b;
  // Enough steps to grow the store several times (it starts at 64 rows).
  for (int step = 0; step < 60; ++step) {
    const std::vector<at::Tensor> layers = StepLayers(6, 4, 10 * step);
    // Sequence a keeps rows 0 and 3, b keeps row 5 (in a step's packed order: a, then b).
    const std::vector<int64_t> slots = store.Put(ids, layers, {0, 3, 5});
    ASSERT_EQ(slots.size(), 3u);
    a.AppendSlots(&store, ids, {slots[0], slots[1]});
    b.AppendSlots(&store, {5}, {slots[2]});  // b's drafter reads layer 5 only
    want_a.insert(want_a.end(), {10.0f * step, 10.0f * step + 3});
    want_b.push_back(100 + 10.0f * step + 5);
    if (step == 29) {  // a catches up midway: its slots are reused by later steps
      EXPECT_EQ(RowIds(a.Take()), (std::vector<std::vector<float>>{want_a, [&] {
                                                                     std::vector<float> v;
                                                                     for (float x : want_a)
                                                                       v.push_back(x + 100);
                                                                     return v;
                                                                   }()}));
      want_a.clear();
      EXPECT_EQ(store.held(), 30);
    }
  }
  EXPECT_GE(store.capacity(), 120);
  EXPECT_EQ(a.rows(), 60);
  EXPECT_EQ(RowIds(a.Take())[0], want_a);
  EXPECT_EQ(RowIds(b.Take()), (std::vector<std::vector<float>>{want_b}));
  // Nothing held: the storage is given back.
  EXPECT_EQ(store.held(), 0);
  EXPECT_EQ(store.capacity(), 0);
}

TEST(HiddenRowStoreTest, ClearedAndDestroyedBacklogsFreeTheirSlots) {
  HiddenRowStore store;
  {
    HiddenBacklog kept, cleared;
    const std::vector<int64_t> slots = store.Put({0}, {StepLayers(4, 3)[0]}, {0, 1, 2});
    kept.AppendSlots(&store, {0}, {slots[0], slots[1]});
    cleared.AppendSlots(&store, {0}, {slots[2]});
    cleared.Clear();
    EXPECT_EQ(cleared.rows(), 0);
    EXPECT_EQ(store.held(), 2);
  }
  EXPECT_EQ(store.held(), 0);
}

TEST(HiddenRowStoreTest, ABadPutKeepsNothing) {
  HiddenRowStore store;
  const std::vector<at::Tensor> layers = StepLayers(4, 3);
  EXPECT_THROW(store.Put({0, 1}, layers, {0, 9}), c10::Error);  // row 9 of a 4-row step
  EXPECT_EQ(store.held(), 0);
  EXPECT_THROW(store.Put({0}, layers, {0}), c10::Error);  // two tensors for one layer id
  const std::vector<int64_t> ok = store.Put({0}, {layers[0]}, {1});
  EXPECT_EQ(store.held(), 1);
  // A layer whose width changes is refused, and the slots of that call are free again.
  EXPECT_THROW(store.Put({0}, {StepLayers(4, 7)[0]}, {1}), c10::Error);
  EXPECT_EQ(store.held(), 1);
  EXPECT_EQ(store.Get({0}, ok)[0][0][0].item<float>(), 1.0f);
  EXPECT_THROW(store.Get({3}, ok), c10::Error);  // a layer never stored
}

TEST(HiddenBacklogTest, ClearDropsEverything) {
  HiddenBacklog backlog;
  backlog.AppendRange(StepLayers(4, 8), 0, 4);
  backlog.Clear();
  EXPECT_EQ(backlog.rows(), 0);
  EXPECT_TRUE(backlog.Take().empty());
}

}  // namespace
}  // namespace specula
