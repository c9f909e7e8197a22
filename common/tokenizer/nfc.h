// Unicode Normalization Form C: canonical decomposition, canonical ordering, then canonical
// composition (UAX #15), as Hugging Face's NFC normalizer applies it (Qwen2/Qwen3 tokenizers).
#pragma once

#include <string>
#include <string_view>

namespace specula {

// Ill-formed bytes are passed through unchanged and never combine with their neighbours. Text
// without code points from U+0300 up (ASCII, Latin-1, most code) is returned without table
// look-ups, since it is already in NFC.
std::string ToNfc(std::string_view text);

}  // namespace specula
