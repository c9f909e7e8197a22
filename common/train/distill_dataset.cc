#include "common/train/distill_dataset.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

namespace specula {
namespace {

constexpr char kMagic[8] = {'S', 'P', 'C', 'D', 'I', 'S', 'T', '1'};
constexpr size_t kHeaderBytes = 16;

uint32_t ReadU32(const uint8_t* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t(p[3]) << 24);
}

void PutU32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Walks the records of `data`; returns the end of the last complete one and fills offsets.
size_t ScanRecords(const uint8_t* data, size_t size, std::vector<size_t>* offsets,
                   int64_t* response_tokens) {
  size_t pos = kHeaderBytes;
  while (pos + 8 <= size) {
    const uint64_t n = uint64_t(ReadU32(data + pos)) + ReadU32(data + pos + 4);
    if (pos + 8 + 2 * n > size) break;
    if (offsets) offsets->push_back(pos);
    if (response_tokens) *response_tokens += ReadU32(data + pos + 4);
    pos += 8 + 2 * n;
  }
  return pos;
}

}  // namespace

StatusOr<DistillDataset> DistillDataset::Open(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  if (file->size() < kHeaderBytes || std::memcmp(file->data(), kMagic, 8) != 0) {
    return DataLossError(StrCat(path, ": not a distillation dataset (bad magic)"));
  }
  DistillDataset d;
  d.vocab_size_ = ReadU32(file->data() + 8);
  const size_t end = ScanRecords(file->data(), file->size(), &d.offsets_, &d.response_tokens_);
  if (end != file->size()) {
    return DataLossError(StrCat(path, ": truncated record after ", d.offsets_.size(),
                                " complete records (resume `specula distill` to repair)"));
  }
  d.file_ = std::move(file);
  return d;
}

DistillRecord DistillDataset::operator[](size_t i) const {
  const uint8_t* p = file_->data() + offsets_[i];
  const uint32_t np = ReadU32(p), nr = ReadU32(p + 4);
  const auto* ids = reinterpret_cast<const uint16_t*>(p + 8);
  return {std::span<const uint16_t>(ids, np), std::span<const uint16_t>(ids + np, nr)};
}

StatusOr<std::unique_ptr<DistillWriter>> DistillWriter::OpenForAppend(const std::string& path,
                                                                      uint32_t vocab_size,
                                                                      size_t* records_present) {
  namespace fs = std::filesystem;
  *records_present = 0;
  if (vocab_size > 65536)
    return InvalidArgumentError("distillation files hold uint16 ids: vocab_size <= 65536");
  std::error_code ec;
  if (fs::exists(path, ec) && fs::file_size(path, ec) > 0) {
    ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    if (bytes.size() < kHeaderBytes || std::memcmp(data, kMagic, 8) != 0) {
      return DataLossError(StrCat(path, ": exists but is not a distillation dataset"));
    }
    if (ReadU32(data + 8) != vocab_size) {
      return FailedPreconditionError(
          StrCat(path, ": was written for vocab_size ", ReadU32(data + 8), ", not ", vocab_size));
    }
    std::vector<size_t> offsets;
    const size_t end = ScanRecords(data, bytes.size(), &offsets, nullptr);
    if (end != bytes.size()) fs::resize_file(path, end);  // drop the partial record of a killed run
    *records_present = offsets.size();
  } else {
    std::string header(kMagic, 8);
    PutU32(header, vocab_size);
    PutU32(header, 0);
    RETURN_IF_ERROR(WriteStringToFile(path, header));
  }
  auto w = std::unique_ptr<DistillWriter>(new DistillWriter());
  w->out_.open(path, std::ios::binary | std::ios::app);
  if (!w->out_) return InternalError(StrCat("cannot append to ", path));
  w->path_ = path;
  w->vocab_size_ = vocab_size;
  return w;
}

Status DistillWriter::Append(const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& response) {
  std::string rec;
  PutU32(rec, static_cast<uint32_t>(prompt.size()));
  PutU32(rec, static_cast<uint32_t>(response.size()));
  for (const auto* part : {&prompt, &response}) {
    for (int32_t id : *part) {
      if (id < 0 || static_cast<uint32_t>(id) >= vocab_size_) {
        return InvalidArgumentError(
            StrCat("token id ", id, " outside the vocabulary of ", vocab_size_));
      }
      rec.push_back(static_cast<char>(id & 0xff));
      rec.push_back(static_cast<char>((id >> 8) & 0xff));
    }
  }
  out_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
  out_.flush();
  if (!out_) return InternalError(StrCat("write to ", path_, " failed"));
  return OkStatus();
}

std::vector<int64_t> ResponseTokenCounts(const DistillDataset& data, size_t num_records) {
  std::vector<int64_t> counts(data.vocab_size(), 0);
  for (size_t i = 0; i < std::min(num_records, data.size()); ++i) {
    for (uint16_t t : data[i].response) {
      if (t < counts.size()) ++counts[t];
    }
  }
  return counts;
}

std::vector<int32_t> DistillTokenStream(const DistillDataset& data, size_t begin, size_t end,
                                        int32_t end_of_text) {
  std::vector<int32_t> out;
  for (size_t i = begin; i < std::min(end, data.size()); ++i) {
    const DistillRecord r = data[i];
    out.insert(out.end(), r.prompt.begin(), r.prompt.end());
    out.insert(out.end(), r.response.begin(), r.response.end());
    if (r.response.empty() || r.response.back() != end_of_text) out.push_back(end_of_text);
  }
  return out;
}

}  // namespace specula
