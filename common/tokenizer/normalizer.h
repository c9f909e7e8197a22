// Normalizers: the text rewrites tokenizer.json applies before pre-tokenization.
//
// Supported: Sequence, Prepend, Replace, Strip (Llama-2 style tokenizers use
// Sequence[Prepend("▁"), Replace(" ", "▁")]) and NFC (Qwen2/Qwen3). The compatibility forms
// (NFKC, NFKD), NFD, Lowercase and the model-specific ones (BertNormalizer, Precompiled) are
// reported as UNIMPLEMENTED.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "common/util/status.h"

namespace specula {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string Normalize(std::string_view text) const = 0;
};

// Parses the "normalizer" field; JSON null gives nullptr (text is left as it is). `path` names the
// field in errors.
StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& json,
                                                      std::string_view path);

}  // namespace specula
