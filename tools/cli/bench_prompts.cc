#include "tools/cli/bench_prompts.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/util/mapped_file.h"

namespace specula::cli {

StatusOr<std::vector<std::vector<int32_t>>> HeldOutPrompts(const Tokenizer& tokenizer,
                                                           const std::string& dir, int64_t count,
                                                           int64_t prompt_tokens) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) {
    return NotFoundError(StrCat("held-out prompt directory ", dir,
                                " does not exist (scripts/setup.sh installs it)"));
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".py") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::vector<int32_t>> tokens;
  for (const auto& f : files) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(f.string()));
    tokens.push_back(tokenizer.Encode(text, /*add_special_tokens=*/false));
  }
  // Round-robin over files: every file's first window, then every file's second, ... Windows start
  // 2 * prompt_tokens apart, so prompts come from different places in the file.
  std::vector<std::vector<int32_t>> prompts;
  bool any = true;
  for (int64_t w = 0; any && static_cast<int64_t>(prompts.size()) < count; ++w) {
    any = false;
    for (const auto& ids : tokens) {
      if (static_cast<int64_t>(prompts.size()) >= count) break;
      const int64_t start = w * 2 * prompt_tokens;
      if (start + prompt_tokens > static_cast<int64_t>(ids.size())) continue;
      any = true;
      prompts.emplace_back(ids.begin() + start, ids.begin() + start + prompt_tokens);
    }
  }
  if (static_cast<int64_t>(prompts.size()) < count) {
    return NotFoundError(StrCat("the .py files under ", dir, " give only ", prompts.size(),
                                " prompts of ", prompt_tokens, " tokens; asked for ", count));
  }
  return prompts;
}

StatusOr<std::vector<std::vector<int32_t>>> PromptFile(const Tokenizer& tokenizer,
                                                       const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::vector<std::vector<int32_t>> prompts;
  std::stringstream in(text);
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return InvalidArgumentError(StrCat(path, " line ", n, ": not a JSON object"));
    }
    if (j.contains("prompt") && j["prompt"].is_string()) {
      prompts.push_back(tokenizer.Encode(j["prompt"].get<std::string>(), true));
    } else if (j.contains("prompt_ids") && j["prompt_ids"].is_array()) {
      std::vector<int32_t> ids;
      for (const auto& v : j["prompt_ids"]) {
        if (!v.is_number_integer()) {
          return InvalidArgumentError(StrCat(path, " line ", n, ": prompt_ids must be integers"));
        }
        ids.push_back(v.get<int32_t>());
      }
      prompts.push_back(std::move(ids));
    } else {
      return InvalidArgumentError(
          StrCat(path, " line ", n, ": needs a string \"prompt\" or an array \"prompt_ids\""));
    }
    if (prompts.back().empty()) return InvalidArgumentError(StrCat(path, " line ", n, ": empty"));
  }
  if (prompts.empty()) return InvalidArgumentError(StrCat(path, ": no prompts"));
  return prompts;
}

}  // namespace specula::cli
