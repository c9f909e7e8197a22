#include "common/model/hidden_capture_pool.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

namespace specula {
namespace {

TEST(HiddenCapturePoolTest, ACaptureIsOneBufferOfPerLayerViews) {
  HiddenCapturePool pool;
  HiddenCapturePool::Capture c = pool.Acquire(3, 2, 8);
  ASSERT_NE(c.data, nullptr);
  ASSERT_EQ(c.layers.size(), 3u);
  for (int64_t l = 0; l < 3; ++l) {
    EXPECT_EQ(c.layers[l].sizes(), (std::vector<int64_t>{2, 8}));
    EXPECT_TRUE(c.layers[l].is_contiguous());
    EXPECT_EQ(c.layers[l].scalar_type(), torch::kFloat);
    EXPECT_EQ(c.layers[l].data_ptr<float>(), c.data + l * 2 * 8);
  }
  EXPECT_EQ(pool.buffers(), 1u);
  EXPECT_EQ(pool.bytes(), 3 * 2 * 8 * 4);
}

TEST(HiddenCapturePoolTest, ABufferIsReusedOnlyOnceNothingHoldsIt) {
  HiddenCapturePool pool;
  float* first = pool.Acquire(2, 1, 16).data;  // the capture is let go of at once
  EXPECT_EQ(pool.Acquire(2, 1, 16).data, first);
  EXPECT_EQ(pool.buffers(), 1u);

  // A backlog's copy of one layer's view holds the buffer.
  at::Tensor kept = pool.Acquire(2, 1, 16).layers[1];
  kept.fill_(7);
  float* second = pool.Acquire(2, 1, 16).data;
  EXPECT_NE(second, first);
  EXPECT_TRUE(torch::equal(kept, torch::full({1, 16}, 7.0f)));
  // So does a tensor made from a view (it shares the storage, not the view).
  at::Tensor row;
  {
    HiddenCapturePool::Capture c = pool.Acquire(2, 1, 16);
    EXPECT_EQ(c.data, second);
    row = c.layers[0].narrow(1, 0, 4);
  }
  EXPECT_NE(pool.Acquire(2, 1, 16).data, second);
  EXPECT_EQ(pool.buffers(), 3u);

  kept = at::Tensor();
  row = at::Tensor();
  // Both free again: no new buffer is made.
  for (int i = 0; i < 6; ++i) pool.Acquire(2, 1, 16);
  EXPECT_EQ(pool.buffers(), 3u);
}

TEST(HiddenCapturePoolTest, BuffersComeBackInTheOrderTheyWereHandedOut) {
  // A drafter's backlogs hold the last few steps' states and let go of the oldest first.
  HiddenCapturePool pool;
  std::vector<at::Tensor> held;
  std::vector<float*> order;
  for (int i = 0; i < 4; ++i) {
    HiddenCapturePool::Capture c = pool.Acquire(1, 1, 16);
    order.push_back(c.data);
    held.push_back(c.layers[0]);
  }
  held.erase(held.begin());  // the oldest let go of
  EXPECT_EQ(pool.Acquire(1, 1, 16).data, order[0]);
  EXPECT_EQ(pool.buffers(), 4u);
}

TEST(HiddenCapturePoolTest, AFreeBufferOfAnotherShapeIsMadeAgainNotLeftBehind) {
  // Batches change size and drafts come and go: the pool must not grow with old shapes.
  HiddenCapturePool pool;
  for (int i = 0; i < 10; ++i) {
    HiddenCapturePool::Capture c = pool.Acquire(2, 1 + i % 3, 16);
    EXPECT_EQ(c.layers[0].size(0), 1 + i % 3);
  }
  EXPECT_EQ(pool.buffers(), 1u);
  EXPECT_EQ(pool.bytes(), 2 * 1 * 16 * 4);  // the last shape's
}

TEST(HiddenCapturePoolTest, ManyRowsAndShapesBeyondTheBudgetGetTheirOwnBuffers) {
  HiddenCapturePool pool(/*max_rows=*/4, /*max_bytes=*/2 * 1 * 4 * 16 * 4);
  // A prompt chunk's capture is not kept.
  float* chunk = pool.Acquire(1, 16, 16).data;
  EXPECT_NE(chunk, nullptr);
  EXPECT_EQ(pool.buffers(), 0u);
  // Two buffers of 4 rows fill the budget.
  at::Tensor a = pool.Acquire(1, 4, 16).layers[0];
  at::Tensor b = pool.Acquire(1, 4, 16).layers[0];
  EXPECT_EQ(pool.buffers(), 2u);
  // Both held: a third is made but not kept.
  at::Tensor c = pool.Acquire(1, 4, 16).layers[0];
  EXPECT_EQ(pool.buffers(), 2u);
  // One free: a capture of another shape replaces it within the budget.
  a = at::Tensor();
  HiddenCapturePool::Capture other = pool.Acquire(1, 2, 16);
  EXPECT_EQ(pool.buffers(), 2u);
  EXPECT_LE(pool.bytes(), 2 * 1 * 4 * 16 * 4);
  EXPECT_EQ(other.layers[0].sizes(), (std::vector<int64_t>{2, 16}));
}

TEST(HiddenCapturePoolTest, LargeCapturesReuseOneBufferWhileNothingHoldsIt) {
  // Prompt chunks and large batches' steps: their rows are copied out right after the step.
  HiddenCapturePool pool(/*max_rows=*/4);
  HiddenCapturePool::Capture a = pool.Acquire(2, 10, 8);
  float* first = a.data;
  EXPECT_EQ(a.layer_stride, 10 * 8);
  a = {};
  HiddenCapturePool::Capture b = pool.Acquire(2, 6, 8);  // fewer rows: the same buffer
  EXPECT_EQ(b.data, first);
  EXPECT_EQ(b.layer_stride, 10 * 8);
  ASSERT_EQ(b.layers.size(), 2u);
  for (int64_t l = 0; l < 2; ++l) {
    EXPECT_EQ(b.layers[l].sizes(), (std::vector<int64_t>{6, 8}));
    EXPECT_TRUE(b.layers[l].is_contiguous());
    EXPECT_EQ(b.layers[l].data_ptr<float>(), first + l * 10 * 8);
  }
  // Held (a backlog's copy of a view): a new buffer, and the held rows stay as written.
  b.layers[1].fill_(3);
  at::Tensor kept = b.layers[1];
  b = {};
  HiddenCapturePool::Capture c = pool.Acquire(2, 12, 8);  // more rows: a larger buffer
  EXPECT_NE(c.data, first);
  EXPECT_EQ(c.layer_stride, 12 * 8);
  EXPECT_TRUE(torch::equal(kept, torch::full({6, 8}, 3.0f)));
  EXPECT_EQ(pool.buffers(), 0u);  // none of them in the ring
}

}  // namespace
}  // namespace specula
