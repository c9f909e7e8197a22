#include "common/model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/model/checkpoint.h"
#include "tests/testing/temp_dir.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string LittleEndian64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file made by hand: length prefix, header text, data bytes.
std::string Safetensors(const std::string& header, const std::string& data) {
  return LittleEndian64(header.size()) + header + data;
}

template <typename T>
TensorView View(const std::string& name, DType dtype, std::vector<int64_t> shape,
                const std::vector<T>& values) {
  TensorView v;
  v.name = name;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.data = reinterpret_cast<const uint8_t*>(values.data());
  v.nbytes = values.size() * sizeof(T);
  return v;
}

TEST(DTypeTest, NamesSizesRoundTrip) {
  const std::vector<std::tuple<DType, std::string, size_t>> all = {
      {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},
      {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
      {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
      {DType::kBool, "BOOL", 1}};
  for (const auto& [dtype, name, size] : all) {
    EXPECT_EQ(DTypeName(dtype), name);
    EXPECT_EQ(DTypeSize(dtype), size) << name;
    auto parsed = ParseDType(name);
    ASSERT_TRUE(parsed.ok()) << name;
    EXPECT_EQ(*parsed, dtype);
  }
  auto bad = ParseDType("F8_E9");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "unknown dtype 'F8_E9'");
  EXPECT_FALSE(ParseDType("f32").ok());  // names are case-sensitive
}

TEST(SafetensorsTest, WriteReadRoundTripManyDtypes) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc000, 0x7f80};  // 1.0, -2.0, +inf
  const std::vector<int64_t> i64 = {-1, 1LL << 40};
  const std::vector<uint8_t> u8 = {1, 2, 3, 4, 5};  // odd size: later tensors are unaligned
  const std::vector<double> f64 = {3.141592653589793};
  const std::vector<uint16_t> f16 = {0x3c00, 0x4000};
  const std::vector<int32_t> i32 = {7, -8, 9, -10};
  const std::vector<int16_t> i16 = {-300};
  const std::vector<int8_t> i8 = {-5, 6};
  const std::vector<uint8_t> flags = {1, 0, 1};
  const std::vector<float> empty;
  const std::vector<TensorView> tensors = {
      View("layer.f32", DType::kF32, {2, 3}, f32),
      View("layer.bf16", DType::kBF16, {3}, bf16),
      View("ids", DType::kI64, {2}, i64),
      View("bytes", DType::kU8, {5}, u8),
      View("scalar", DType::kF64, {}, f64),
      View("half", DType::kF16, {1, 2}, f16),
      View("i32", DType::kI32, {2, 2}, i32),
      View("i16", DType::kI16, {1}, i16),
      View("i8", DType::kI8, {2}, i8),
      View("mask", DType::kBool, {3}, flags),
      View("empty", DType::kF32, {0, 4}, empty),
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"shard", "1/2"}};
  ASSERT_TRUE(WriteSafetensors(path, tensors, metadata).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // The data section starts 8-byte aligned.
  const std::string raw = ReadBytes(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  size_t total = 0;
  for (const auto& t : tensors) total += t.nbytes;
  EXPECT_EQ(raw.size(), 8 + header_len + total);

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), path);
  EXPECT_EQ((*file)->metadata(), metadata);
  ASSERT_EQ((*file)->tensors().size(), tensors.size());
  for (const TensorView& want : tensors) {
    const TensorView* got = (*file)->Find(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->name, want.name);
    EXPECT_EQ(got->dtype, want.dtype) << want.name;
    EXPECT_EQ(got->shape, want.shape) << want.name;
    EXPECT_EQ(got->nbytes, want.nbytes) << want.name;
    EXPECT_EQ(got->numel(), want.numel()) << want.name;
    if (want.nbytes > 0) {
      EXPECT_EQ(std::memcmp(got->data, want.data, want.nbytes), 0) << want.name;
    }
  }
  EXPECT_EQ((*file)->Find("missing"), nullptr);
  EXPECT_EQ((*file)->Find("scalar")->numel(), 1);
}

TEST(SafetensorsTest, NoMetadataAndNoTensors) {
  TempDir dir;
  const std::string path = dir.File("empty.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->tensors().empty());
  EXPECT_TRUE((*file)->metadata().empty());
}

TEST(SafetensorsTest, WriteRejectsShapeNotMatchingBytes) {
  TempDir dir;
  const std::vector<float> values = {1.0f, 2.0f, 3.0f};
  Status s =
      WriteSafetensors(dir.File("bad.safetensors"), {View("w", DType::kF32, {2, 2}, values)});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_FALSE(fs::exists(dir.File("bad.safetensors")));
}

// --- Bad files: each names the file (and the tensor at fault). ---

TEST(SafetensorsOpenTest, MissingFileIsNotFound) {
  TempDir dir;
  const std::string path = dir.File("nope.safetensors");
  auto file = SafetensorsFile::Open(path);
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr(path));
}

TEST(SafetensorsOpenTest, TinyFileIsTruncated) {
  TempDir dir;
  for (const std::string& bytes : {std::string("\x10\0\0\0", 4), std::string()}) {
    const std::string path = dir.File("tiny.safetensors");
    WriteBytes(path, bytes);
    auto file = SafetensorsFile::Open(path);
    EXPECT_EQ(file.status().code(), StatusCode::kDataLoss) << bytes.size();
    EXPECT_THAT(file.status().message(), AllOf(HasSubstr(path), HasSubstr("truncated"),
                                               HasSubstr(std::to_string(bytes.size()) + " bytes")));
  }
}

TEST(SafetensorsOpenTest, HeaderLengthLargerThanFile) {
  TempDir dir;
  const std::string path = dir.File("short.safetensors");
  WriteBytes(path, LittleEndian64(1000) + "{\"a\":1}");
  auto file = SafetensorsFile::Open(path);
  EXPECT_EQ(file.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(), AllOf(HasSubstr(path), HasSubstr("header length 1000"),
                                             HasSubstr("file has 15 bytes")));

  // A huge length (e.g. a non-safetensors file) must not overflow the bounds check.
  WriteBytes(path, std::string(8, '\xff') + "{}");
  file = SafetensorsFile::Open(path);
  EXPECT_EQ(file.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(), HasSubstr(path));
}

TEST(SafetensorsOpenTest, HeaderNotJson) {
  TempDir dir;
  const std::string path = dir.File("bad_header.safetensors");
  for (const std::string& header :
       {std::string("{not json"), std::string("[1, 2]"), std::string("\"text\"")}) {
    WriteBytes(path, Safetensors(header, ""));
    auto file = SafetensorsFile::Open(path);
    EXPECT_EQ(file.status().code(), StatusCode::kDataLoss) << header;
    EXPECT_THAT(file.status().message(),
                AllOf(HasSubstr(path), HasSubstr("bad safetensors header")))
        << header;
  }
}

TEST(SafetensorsOpenTest, UnknownDtypeNamesTensorAndDtype) {
  TempDir dir;
  const std::string path = dir.File("dtype.safetensors");
  WriteBytes(path, Safetensors(R"({"w":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,2]}})",
                               std::string(2, '\0')));
  auto file = SafetensorsFile::Open(path);
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(file.status().message(), path + ": tensor 'w': unknown dtype 'F8_E9'");
}

TEST(SafetensorsOpenTest, DataOffsetsOutsideTheFile) {
  TempDir dir;
  const std::string path = dir.File("offsets.safetensors");
  // 16 bytes declared, 8 present: a truncated data section.
  WriteBytes(path, Safetensors(R"({"ok":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                               R"("w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                               std::string(8, '\0')));
  auto file = SafetensorsFile::Open(path);
  EXPECT_EQ(file.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(),
              AllOf(HasSubstr(path), HasSubstr("tensor 'w'"), HasSubstr("[0, 16]"),
                    HasSubstr("data section of 8 bytes")));

  // begin > end.
  WriteBytes(path, Safetensors(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})",
                               std::string(8, '\0')));
  file = SafetensorsFile::Open(path);
  EXPECT_EQ(file.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(), AllOf(HasSubstr(path), HasSubstr("tensor 'w'")));
}

TEST(SafetensorsOpenTest, ShapeNotMatchingByteSize) {
  TempDir dir;
  const std::string path = dir.File("shape.safetensors");
  WriteBytes(path, Safetensors(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})",
                               std::string(16, '\0')));
  auto file = SafetensorsFile::Open(path);
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(file.status().message(),
            path + ": tensor 'w': shape holds 12 bytes but data_offsets span 16");
}

TEST(SafetensorsOpenTest, MalformedEntries) {
  TempDir dir;
  const std::string path = dir.File("entries.safetensors");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"w":{"dtype":"F32","shape":[1]}})", "needs dtype, shape and data_offsets"},
      {R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "dtype must be a string"},
      {R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", "shape must be a list"},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "shape entries"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})",
       "data_offsets must be [begin, end]"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,4]}})", "data_offsets must be"},
      {R"({"w":[1,2,3]})", "needs dtype, shape and data_offsets"},
  };
  for (const auto& [header, what] : cases) {
    WriteBytes(path, Safetensors(header, std::string(8, '\0')));
    auto file = SafetensorsFile::Open(path);
    EXPECT_EQ(file.status().code(), StatusCode::kDataLoss) << header;
    EXPECT_THAT(file.status().message(),
                AllOf(HasSubstr(path), HasSubstr("tensor 'w'"), HasSubstr(what)))
        << header;
  }
}

// A shape whose byte size wraps around 2^64 must not pass the size check with 0 bytes of data
// (LoadSafetensorsFile would build a tensor view far larger than the mapping).
TEST(SafetensorsOpenTest, ShapeProductOverflowIsRejected) {
  TempDir dir;
  const std::string path = dir.File("overflow.safetensors");
  WriteBytes(path, Safetensors(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],)"
                               R"("data_offsets":[0,0]}})",
                               ""));
  auto file = SafetensorsFile::Open(path);
  EXPECT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("tensor 'w'"));
}

// --- Torch-level checkpoints (checkpoint.h). ---

TEST(CheckpointTest, SaveLoadRoundTripKeepsDtypesAndValues) {
  TempDir dir;
  torch::manual_seed(0);
  const std::map<std::string, at::Tensor> tensors = {
      {"a.f32", torch::randn({3, 4})},
      {"b.bf16", torch::randn({5}).to(torch::kBFloat16)},
      {"c.i64", torch::tensor(std::vector<int64_t>{-3, 1LL << 50, 7})},
      {"d.f16", torch::randn({2, 2}).to(torch::kHalf)},
      {"e.bool", torch::tensor(std::vector<int64_t>{1, 0, 1}).to(torch::kBool)},
      // Non-contiguous input: saved as its contiguous copy.
      {"f.t", torch::arange(6, torch::kFloat).view({2, 3}).t()},
  };
  const std::string path = dir.File("model.safetensors");
  ASSERT_TRUE(SaveSafetensorsFile(path, tensors, {{"format", "pt"}}).ok());
  auto loaded = LoadSafetensorsFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), tensors.size());
  for (const auto& [name, want] : tensors) {
    ASSERT_TRUE(loaded->count(name)) << name;
    const at::Tensor& got = loaded->at(name);
    EXPECT_EQ(got.scalar_type(), want.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), want.sizes()) << name;
    EXPECT_TRUE(torch::equal(got, want)) << name;
  }
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->metadata().at("format"), "pt");

  // Tensors stay valid after the loader's map is gone (they keep the mapping alive).
  at::Tensor kept = LoadSafetensorsFile(path)->at("a.f32");
  EXPECT_TRUE(torch::equal(kept, tensors.at("a.f32")));
  // Writes go to a private copy, never to the file.
  kept.fill_(0.0f);
  EXPECT_TRUE(torch::equal(LoadSafetensorsFile(path)->at("a.f32"), tensors.at("a.f32")));
}

TEST(CheckpointTest, UnsupportedTorchDtype) {
  TempDir dir;
  Status s = SaveSafetensorsFile(dir.File("c.safetensors"),
                                 {{"z", torch::zeros({2}, torch::kComplexFloat)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(CheckpointTest, ShardedDirectoryWithIndex) {
  TempDir dir;
  const std::map<std::string, at::Tensor> shard1 = {{"model.a", torch::ones({2, 2})},
                                                    {"model.b", torch::arange(3, torch::kLong)}};
  const std::map<std::string, at::Tensor> shard2 = {
      {"lm_head.weight", torch::full({4}, 2.5).to(torch::kBFloat16)}};
  ASSERT_TRUE(
      SaveSafetensorsFile(dir.File("model-00001-of-00002.safetensors"), shard1, {{"format", "pt"}})
          .ok());
  ASSERT_TRUE(
      SaveSafetensorsFile(dir.File("model-00002-of-00002.safetensors"), shard2, {{"format", "pt"}})
          .ok());
  const std::string index = R"({"metadata": {"total_size": 40}, "weight_map": {
      "model.a": "model-00001-of-00002.safetensors",
      "model.b": "model-00001-of-00002.safetensors",
      "lm_head.weight": "model-00002-of-00002.safetensors"}})";
  WriteBytes(dir.File("model.safetensors.index.json"), index);

  auto all = LoadSafetensorsDir(dir.path().string());
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_TRUE(torch::equal(all->at("model.a"), shard1.at("model.a")));
  EXPECT_TRUE(torch::equal(all->at("model.b"), shard1.at("model.b")));
  EXPECT_EQ(all->at("lm_head.weight").scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(all->at("lm_head.weight"), shard2.at("lm_head.weight")));

  // A tensor in two shards.
  ASSERT_TRUE(SaveSafetensorsFile(dir.File("model-00002-of-00002.safetensors"),
                                  {{"model.a", torch::zeros({2, 2})}})
                  .ok());
  all = LoadSafetensorsDir(dir.path().string());
  EXPECT_EQ(all.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(all.status().message(),
              AllOf(HasSubstr("model.a"), HasSubstr("appears in two shards")));

  // A shard the index names but that is missing.
  fs::remove(dir.File("model-00002-of-00002.safetensors"));
  all = LoadSafetensorsDir(dir.path().string());
  EXPECT_EQ(all.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(all.status().message(), HasSubstr("model-00002-of-00002.safetensors"));

  // A malformed index.
  WriteBytes(dir.File("model.safetensors.index.json"), R"({"metadata": {}})");
  all = LoadSafetensorsDir(dir.path().string());
  EXPECT_EQ(all.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(all.status().message(),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("weight_map")));
  WriteBytes(dir.File("model.safetensors.index.json"), R"({"weight_map": {"x": 3}})");
  all = LoadSafetensorsDir(dir.path().string());
  EXPECT_EQ(all.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(all.status().message(), HasSubstr("weight_map['x']"));
}

TEST(CheckpointTest, DirectoryErrors) {
  TempDir dir;
  auto missing = LoadSafetensorsDir(dir.File("absent"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("absent"));

  auto empty = LoadSafetensorsDir(dir.path().string());
  EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(empty.status().message(), HasSubstr("no model.safetensors"));

  // Errors from a file inside the directory keep the file name.
  WriteBytes(dir.File("model.safetensors"), "abc");
  auto broken = LoadSafetensorsDir(dir.path().string());
  EXPECT_EQ(broken.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(broken.status().message(), HasSubstr(dir.File("model.safetensors")));
}

}  // namespace
}  // namespace specula
