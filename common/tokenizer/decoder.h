// Decoders: turn the token strings of a sequence back into text.
//
// Supported tokenizer.json types: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip and
// Sequence. Decoders work on raw bytes: ByteLevel and ByteFallback may produce ill-formed UTF-8 (a
// character split across tokens), which Tokenizer::Decode replaces with U+FFFD only at the very
// end. Hugging Face's ByteFallback instead turns a whole ill-formed run of byte tokens into one
// U+FFFD per byte; the two agree on every well-formed output.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/util/status.h"

namespace specula {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the list of token strings; the decoded text is their concatenation.
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// Parses the "decoder" field; JSON null gives nullptr (tokens are joined with spaces).
StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& json, std::string_view path);

}  // namespace specula
