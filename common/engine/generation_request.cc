#include "common/engine/generation_request.h"

namespace specula {

Status ValidateGenerationRequest(const GenerationRequest& r, int64_t vocab_size,
                                 int64_t context_length) {
  if (r.prompt.empty()) return InvalidArgumentError("prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab_size) {
      return InvalidArgumentError(StrCat("prompt token ", i, " = ", r.prompt[i],
                                         " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  if (r.max_new_tokens <= 0) {
    return InvalidArgumentError(StrCat("max_new_tokens must be positive, got ", r.max_new_tokens));
  }
  if (static_cast<int64_t>(r.prompt.size()) >= context_length) {
    return OutOfRangeError(StrCat("prompt of ", r.prompt.size(),
                                  " tokens is longer than the context length of ", context_length,
                                  " (leave room for at least one new token)"));
  }
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  if (total > context_length) {
    return OutOfRangeError(StrCat("prompt of ", r.prompt.size(), " tokens plus max_new_tokens ",
                                  r.max_new_tokens, " exceeds the context length of ",
                                  context_length));
  }
  return r.sampling.Validate();
}

}  // namespace specula
