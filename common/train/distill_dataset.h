// The self-distillation dataset: prompts with the TARGET model's own greedy continuations, which
// every drafter trains on (SpecFormer / ParallelSpec: train on what the target actually says).
//
// File format (little-endian), one file:
//   header  : 8-byte magic "SPCDIST1", uint32 vocab_size, uint32 reserved (0)
//   records : uint32 prompt_len, uint32 response_len, then prompt_len + response_len uint16 token
//   ids
// Records are appended one by one, so an interrupted run leaves at most one partial record at the
// end; DistillWriter::OpenForAppend drops it and generation resumes from the next record.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/util/mapped_file.h"
#include "common/util/status.h"

namespace specula {

struct DistillRecord {
  std::span<const uint16_t> prompt;
  std::span<const uint16_t> response;
};

class DistillDataset;

// How often each token id appears in the responses of records [0, num_records) (the target's own
// outputs): the ranking `specula draft-vocab` keeps the top of. Ids >= vocab_size are not counted.
std::vector<int64_t> ResponseTokenCounts(const DistillDataset& data, size_t num_records);

// Records [begin, end) as one token stream for causal-LM training (a draft LM fine-tuned on what
// the target says): each record's prompt, then its response, then `end_of_text` unless the response
// already ends with it (the target stopped there).
std::vector<int32_t> DistillTokenStream(const DistillDataset& data, size_t begin, size_t end,
                                        int32_t end_of_text);

class DistillDataset {
 public:
  // NOT_FOUND if missing; DATA_LOSS for a bad magic or a truncated record.
  static StatusOr<DistillDataset> Open(const std::string& path);
  size_t size() const { return offsets_.size(); }
  DistillRecord operator[](size_t i) const;
  uint32_t vocab_size() const { return vocab_size_; }
  int64_t total_response_tokens() const { return response_tokens_; }

 private:
  std::shared_ptr<MappedFile> file_;
  std::vector<size_t> offsets_;  // byte offset of each record's header
  uint32_t vocab_size_ = 0;
  int64_t response_tokens_ = 0;
};

class DistillWriter {
 public:
  // Creates the file, or opens an existing one for appending after checking its header and cutting
  // a trailing partial record. `records_present` receives the number of complete records.
  static StatusOr<std::unique_ptr<DistillWriter>> OpenForAppend(const std::string& path,
                                                                uint32_t vocab_size,
                                                                size_t* records_present);
  // Appends and flushes one record. INVALID_ARGUMENT for ids that do not fit the vocabulary.
  Status Append(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response);

 private:
  std::ofstream out_;
  std::string path_;
  uint32_t vocab_size_ = 0;
};

}  // namespace specula
