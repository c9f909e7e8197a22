// Prompts for benchmarks: held-out Python sources (never trained on) cut into fixed-length token
// prefixes, or a JSONL file of {"prompt": "..."} / {"prompt_ids": [...]} lines.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "common/util/status.h"

namespace specula::cli {

// The default held-out prompt source (the Python test suite, excluded from every training set).
inline constexpr char kHeldOutPromptDir[] = "/usr/lib/python3.11/test";

// `count` prompts of `prompt_tokens` tokens cut from the .py files under `dir` (sorted): the first
// window of every file, then the second, ... (windows 2 * prompt_tokens apart).
StatusOr<std::vector<std::vector<int32_t>>> HeldOutPrompts(const Tokenizer& tokenizer,
                                                           const std::string& dir, int64_t count,
                                                           int64_t prompt_tokens);

// Every line of a JSONL file: "prompt" (text, tokenized with `tokenizer`) or "prompt_ids".
// INVALID_ARGUMENT names the line.
StatusOr<std::vector<std::vector<int32_t>>> PromptFile(const Tokenizer& tokenizer,
                                                       const std::string& path);

}  // namespace specula::cli
