#include "common/spec/hidden_backlog.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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

TEST(HiddenBacklogTest, TakenRowsStayValidAfterNewAppends) {
  HiddenBacklog backlog;
  backlog.AppendRows(StepLayers(4, 8), {1, 3});
  const auto first = backlog.Take();
  backlog.AppendRows(StepLayers(4, 8, 50), {0, 1, 2, 3});  // must not write into `first`
  EXPECT_EQ(RowIds(first)[0], (std::vector<float>{1, 3}));
  EXPECT_EQ(RowIds(backlog.Take())[0], (std::vector<float>{50, 51, 52, 53}));
}

TEST(HiddenBacklogTest, NonContiguousStepsTakeTheGeneralPathWithTheSameResult) {
  HiddenBacklog backlog;
  std::vector<at::Tensor> strided;
  for (const at::Tensor& t : StepLayers(8, 6)) strided.push_back(t.t().contiguous().t());
  ASSERT_FALSE(strided[0].is_contiguous());
  backlog.AppendRange(strided, 0, 2);
  backlog.AppendRows(StepLayers(8, 6, 20), {7});  // stays on the path it started on
  EXPECT_EQ(RowIds(backlog.Take())[1], (std::vector<float>{100, 101, 127}));
}

TEST(GatherStepRowsTest, EachSequenceGetsItsRowsInOrderFromOneGatherPerLayer) {
  const std::vector<at::Tensor> layers = StepLayers(12, 4);
  const auto rows = GatherStepRows(layers, {{3, 1}, {}, {11, 0, 5}});
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(RowIds(rows[0]), (std::vector<std::vector<float>>{{3, 1}, {103, 101}}));
  EXPECT_EQ(rows[1][0].size(0), 0);
  EXPECT_EQ(RowIds(rows[2]), (std::vector<std::vector<float>>{{11, 0, 5}, {111, 100, 105}}));
  // Views of one gather per layer, not copies per sequence.
  EXPECT_EQ(rows[0][0].storage().data(), rows[2][0].storage().data());
  EXPECT_TRUE(GatherStepRows(layers, {{}, {}})[0].empty());
}

TEST(HiddenBacklogTest, GatheredViewsAreKeptAndCompactedInOrder) {
  // The device path on CPU tensors: non-contiguous gathers are kept as they are (no buffer).
  HiddenBacklog backlog;
  std::vector<float> want;
  const int steps = static_cast<int>(HiddenBacklog::kMaxChunks) + 7;
  for (int step = 0; step < steps; ++step) {
    std::vector<at::Tensor> strided;
    for (const at::Tensor& t : StepLayers(3, 5, 10 * step))
      strided.push_back(t.t().contiguous().t());
    const auto rows = GatherStepRows(strided, {{0}, {2, 1}});
    std::vector<at::Tensor> mine;
    for (const at::Tensor& r : rows[1]) mine.push_back(r.t().contiguous().t());  // keep it strided
    backlog.AppendGathered(std::move(mine));
    want.push_back(10 * step + 2);
    want.push_back(10 * step + 1);
    EXPECT_LT(backlog.chunks(), HiddenBacklog::kMaxChunks) << "step " << step;
  }
  EXPECT_EQ(backlog.rows(), 2 * steps);
  EXPECT_EQ(RowIds(backlog.Take())[0], want);
  // Contiguous CPU rows are copied into the buffers instead.
  backlog.AppendGathered(GatherStepRows(StepLayers(4, 8), {{3, 2}})[0]);
  backlog.AppendGathered(GatherStepRows(StepLayers(4, 8, 40), {{0}})[0]);
  EXPECT_EQ(backlog.chunks(), 1u);
  EXPECT_EQ(RowIds(backlog.Take())[1], (std::vector<float>{103, 102, 140}));
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
