#include "common/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/tokenizer/utf8.h"

namespace specula {
namespace {

std::string ErrorMessage(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return StrCat("error ", code);
  return reinterpret_cast<const char*>(buffer);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

StatusOr<Regex> Regex::Compile(std::string_view pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    return InvalidArgumentError(StrCat("regex '", pattern, "' does not compile at offset ",
                                       error_offset, ": ", ErrorMessage(error_code)));
  }
  // JIT is an optimisation only: without it (unsupported platform) the interpreter gives the same
  // results.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return Regex(std::string(pattern), std::shared_ptr<pcre2_code>(code, pcre2_code_free));
}

bool Regex::MatchAt(std::string_view text, size_t offset, void* match_data, size_t* begin,
                    size_t* end) const {
  auto* data = static_cast<pcre2_match_data*>(match_data);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = pcre2_match(code_.get(), subject, text.size(), offset, 0, data, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    // The JIT's small default stack overflows on very long matches; the interpreter uses the heap.
    rc = pcre2_match(code_.get(), subject, text.size(), offset, PCRE2_NO_JIT, data, nullptr);
  }
  // Any failure other than "no match" (match or heap limits on pathological input) also ends the
  // search: callers keep the unmatched rest of the text as it is, so nothing is lost.
  if (rc < 0) return false;
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  *begin = ovector[0];
  *end = ovector[1];
  return true;
}

void Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr));
  size_t offset = 0;
  size_t begin = 0;
  size_t end = 0;
  while (offset <= text.size() && MatchAt(text, offset, data.get(), &begin, &end)) {
    if (end == begin) {
      // Skip empty matches, stepping over one whole character so the search makes progress.
      if (begin >= text.size()) break;
      offset = begin + utf8::CharLength(text, begin);
      continue;
    }
    matches->emplace_back(begin, end);
    offset = end;
  }
}

bool Regex::Matches(std::string_view text) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr));
  size_t begin = 0;
  size_t end = 0;
  return MatchAt(text, 0, data.get(), &begin, &end);
}

}  // namespace specula
