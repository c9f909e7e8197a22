// How a drafter's CPU forwards multiply (--drafter-matmul). The target always multiplies in
// float32: its results are the output. A drafter's only propose tokens the target verifies, so
// cheaper, inexact products change how many drafts are accepted, never the output.
#pragma once

#include <optional>
#include <string_view>

namespace specula {

enum class DraftMatmul {
  kFloat32,   // the weights themselves (or their packed float32 copies): the model's results
  kBfloat16,  // bfloat16 copies, inputs rounded to bfloat16 (AVX512-BF16; SmallMatmulBf16Raw)
  kInt8,      // int8 copies scaled per output, float32 inputs (AVX-512; Int8MatmulRaw)
};

inline std::string_view DraftMatmulName(DraftMatmul m) {
  switch (m) {
    case DraftMatmul::kBfloat16:
      return "bfloat16";
    case DraftMatmul::kInt8:
      return "int8";
    case DraftMatmul::kFloat32:
      break;
  }
  return "float32";
}

// nullopt for a name that is none of DraftMatmulName's.
inline std::optional<DraftMatmul> ParseDraftMatmul(std::string_view name) {
  for (DraftMatmul m : {DraftMatmul::kFloat32, DraftMatmul::kBfloat16, DraftMatmul::kInt8}) {
    if (name == DraftMatmulName(m)) return m;
  }
  return std::nullopt;
}

}  // namespace specula
