// A compiled PCRE2 regular expression with the semantics tokenizer.json patterns expect.
//
// Patterns are compiled with PCRE2_UTF | PCRE2_UCP (\s, \w, \p{L} are Unicode-aware, as in the
// Oniguruma/fancy-regex engines Hugging Face uses) and PCRE2_MATCH_INVALID_UTF, so ill-formed input
// bytes simply never match instead of failing the whole search. JIT-compiled when available.
// Thread-safe: matching allocates its own match data.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/util/status.h"

struct pcre2_real_code_8;

namespace specula {

class Regex {
 public:
  // INVALID_ARGUMENT with PCRE2's message and offset if the pattern does not compile.
  static StatusOr<Regex> Compile(std::string_view pattern);

  // Appends the [begin, end) byte ranges of successive non-overlapping, non-empty matches.
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const;

  // True if the pattern matches somewhere in `text`.
  bool Matches(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, std::shared_ptr<pcre2_real_code_8> code)
      : pattern_(std::move(pattern)), code_(std::move(code)) {}

  // Runs one match at `offset`; returns false when there is no further match.
  bool MatchAt(std::string_view text, size_t offset, void* match_data, size_t* begin,
               size_t* end) const;

  std::string pattern_;
  std::shared_ptr<pcre2_real_code_8> code_;
};

}  // namespace specula
