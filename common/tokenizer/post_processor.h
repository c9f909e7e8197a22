// Post-processors: add special tokens around an encoded sequence (Encode with
// add_special_tokens=true).
//
// Supported: TemplateProcessing (single-sequence template, e.g. Llama's "<s> $A"), BertProcessing
// and RobertaProcessing ([CLS] $A [SEP]), ByteLevel (offset trimming only, so ids are unchanged)
// and Sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/util/status.h"

namespace specula {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Rewrites the ids of one encoded sequence.
  virtual void Process(std::vector<int32_t>* ids) const = 0;
  // The special token this processor puts first, if any (the model's BOS).
  virtual std::optional<int32_t> LeadingId() const = 0;
};

// Parses the "post_processor" field; JSON null gives nullptr (ids are left as they are).
StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const nlohmann::json& json,
                                                            std::string_view path);

}  // namespace specula
