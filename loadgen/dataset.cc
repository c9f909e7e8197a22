#include "loadgen/dataset.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

namespace specula::loadgen {
namespace {

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(StrCat("cannot open dataset ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The per-request settings of one JSONL object; "" when they are well-formed, else what is wrong.
std::string ParseOverrides(const nlohmann::json& j, RequestOverrides* o) {
  auto number = [&](const char* key, double low, bool low_open, double high, double* out) {
    if (!j.contains(key)) return std::string();
    const auto& v = j[key];
    const double x = v.is_number() ? v.get<double>() : std::nan("");
    if (!std::isfinite(x) || (low_open ? x <= low : x < low) || x > high) {
      if (high == std::numeric_limits<double>::max()) {
        return StrCat(key, " must be a number ", low_open ? "> " : ">= ", low);
      }
      return StrCat(key, " must be a number in ", low_open ? "(" : "[", low, ", ", high, "]");
    }
    *out = x;
    return std::string();
  };
  auto integer = [&](const char* key, int64_t low, int64_t high, int64_t* out) {
    if (!j.contains(key)) return std::string();
    const auto& v = j[key];
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(high)
                                : v.get<int64_t>() < low || v.get<int64_t>() > high)) {
      return StrCat(key, " must be an integer in [", low, ", ", high, "]");
    }
    *out = v.get<int64_t>();
    return std::string();
  };
  constexpr double kInf = std::numeric_limits<double>::max();
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  double x = 0;
  int64_t n = 0;
  std::string e;
  if (j.contains("drafter")) {
    if (!j["drafter"].is_string()) return "drafter must be a string";
    o->drafter = j["drafter"].get<std::string>();
  }
  if (!(e = integer("max_draft_tokens", 0, kInt32Max, &n)).empty()) return e;
  if (j.contains("max_draft_tokens")) o->max_draft_tokens = static_cast<int32_t>(n);
  if (!(e = number("temperature", 0, false, kInf, &x)).empty()) return e;
  if (j.contains("temperature")) o->temperature = static_cast<float>(x);
  if (!(e = number("top_p", 0, true, 1, &x)).empty()) return e;
  if (j.contains("top_p")) o->top_p = static_cast<float>(x);
  if (!(e = integer("top_k", 0, kInt32Max, &n)).empty()) return e;
  if (j.contains("top_k")) o->top_k = static_cast<int32_t>(n);
  if (j.contains("seed")) {
    const auto& v = j["seed"];
    if (!v.is_number_unsigned()) return "seed must be a non-negative integer";
    o->seed = v.get<uint64_t>();
  }
  if (j.contains("ignore_eos")) {
    if (!j["ignore_eos"].is_boolean()) return "ignore_eos must be true or false";
    o->ignore_eos = j["ignore_eos"].get<bool>();
  }
  if (j.contains("stop")) {
    if (!j["stop"].is_array()) return "stop must be an array of non-empty strings";
    for (const auto& v : j["stop"]) {
      if (!v.is_string() || v.get<std::string>().empty()) {
        return "stop must be an array of non-empty strings";
      }
      o->stop.push_back(v.get<std::string>());
    }
  }
  if (!(e = number("cancel_after_ms", 0, true, kInf, &x)).empty()) return e;
  if (j.contains("cancel_after_ms")) o->cancel_after_s = x / 1e3;
  if (!(e = number("timeout_ms", 0, true, kInf, &x)).empty()) return e;
  if (j.contains("timeout_ms")) o->timeout_s = x / 1e3;
  return std::string();
}

}  // namespace

StatusOr<std::vector<SampleRequest>> LoadJsonlDataset(const Tokenizer& tokenizer,
                                                      const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<SampleRequest> out;
  std::stringstream in(text);
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto bad = [&](const std::string& why) {
      return InvalidArgumentError(StrCat(path, " line ", n, ": ", why));
    };
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    SampleRequest r;
    if (j.contains("prompt") && j["prompt"].is_string()) {
      r.prompt_ids = tokenizer.Encode(j["prompt"].get<std::string>(), true);
    } else if (j.contains("prompt_ids") && j["prompt_ids"].is_array()) {
      for (const auto& v : j["prompt_ids"]) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
            v.get<int64_t>() >= tokenizer.vocab_size()) {
          return bad(StrCat("prompt_ids must be integers in [0, ", tokenizer.vocab_size(), ")"));
        }
        r.prompt_ids.push_back(v.get<int32_t>());
      }
    } else {
      return bad("needs a string \"prompt\" or an array \"prompt_ids\"");
    }
    if (r.prompt_ids.empty()) return bad("empty prompt");
    if (j.contains("output_len")) {
      if (!j["output_len"].is_number_integer() || j["output_len"].get<int64_t>() < 1) {
        return bad("output_len must be a positive integer");
      }
      r.output_len = j["output_len"].get<int64_t>();
    }
    if (const std::string why = ParseOverrides(j, &r.overrides); !why.empty()) return bad(why);
    out.push_back(std::move(r));
  }
  if (out.empty()) return InvalidArgumentError(StrCat(path, ": no prompts"));
  return out;
}

StatusOr<std::vector<SampleRequest>> LoadShareGptDataset(const Tokenizer& tokenizer,
                                                         const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(StrCat(path, ": not valid JSON"));
  if (!j.is_array()) {
    return InvalidArgumentError(StrCat(path, ": a ShareGPT file is a JSON array of entries"));
  }
  std::vector<SampleRequest> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& entry = j[i];
    auto bad = [&](const std::string& why) {
      return InvalidArgumentError(StrCat(path, " entry ", i, ": ", why));
    };
    if (!entry.is_object() || !entry.contains("conversations") ||
        !entry["conversations"].is_array()) {
      return bad("needs a \"conversations\" array");
    }
    const auto& turns = entry["conversations"];
    std::string prompt, reply;
    bool have_prompt = false, have_reply = false;
    for (size_t t = 0; t < turns.size() && !have_reply; ++t) {
      const auto& turn = turns[t];
      if (!turn.is_object() || !turn.contains("from") || !turn["from"].is_string() ||
          !turn.contains("value") || !turn["value"].is_string()) {
        return bad(StrCat("turn ", t, " needs string \"from\" and \"value\""));
      }
      const std::string from = turn["from"].get<std::string>();
      if (!have_prompt && (from == "human" || from == "user")) {
        prompt = turn["value"].get<std::string>();
        have_prompt = true;
      } else if (have_prompt && (from == "gpt" || from == "assistant")) {
        reply = turn["value"].get<std::string>();
        have_reply = true;
      }
    }
    if (!have_reply) continue;
    SampleRequest r;
    r.prompt_ids = tokenizer.Encode(prompt, true);
    r.output_len = static_cast<int64_t>(tokenizer.Encode(reply, false).size());
    if (r.prompt_ids.empty() || r.output_len < 1) continue;
    out.push_back(std::move(r));
  }
  if (out.empty()) {
    return InvalidArgumentError(StrCat(path, ": no entry has a human turn followed by a gpt turn"));
  }
  return out;
}

std::pair<int64_t, int64_t> RandomLengthBounds(int64_t len, double range_ratio, int64_t at_least) {
  const double l = static_cast<double>(len);
  int64_t low = static_cast<int64_t>(std::floor(l * (1 - range_ratio)));
  int64_t high = static_cast<int64_t>(std::ceil(l * (1 + range_ratio)));
  low = std::max(low, at_least);
  high = std::max(high, low);
  return {low, high};
}

namespace {

Status CheckRangeRatio(double range_ratio) {
  if (range_ratio >= 0 && range_ratio < 1) return OkStatus();
  return InvalidArgumentError(StrCat("--random-range-ratio must be in [0, 1), got ", range_ratio));
}

}  // namespace

Status SpreadOutputLengths(std::vector<SampleRequest>& requests, int64_t output_len,
                           double range_ratio, uint64_t seed) {
  RETURN_IF_ERROR(CheckRangeRatio(range_ratio));
  const auto [low, high] = RandomLengthBounds(output_len, range_ratio, 1);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> len(low, high);
  for (SampleRequest& r : requests) {
    if (r.output_len == 0) r.output_len = len(rng);
  }
  return OkStatus();
}

StatusOr<std::vector<SampleRequest>> RandomDataset(const Tokenizer& tokenizer,
                                                   const RandomDatasetOptions& o) {
  RETURN_IF_ERROR(CheckRangeRatio(o.range_ratio));
  if (o.input_len < 1) {
    return InvalidArgumentError(StrCat("--random-input-len must be >= 1, got ", o.input_len));
  }
  if (o.output_len < 1) {
    return InvalidArgumentError(StrCat("--random-output-len must be >= 1, got ", o.output_len));
  }
  if (o.num_prompts < 1) {
    return InvalidArgumentError(StrCat("--num-prompts must be >= 1, got ", o.num_prompts));
  }
  std::vector<int32_t> allowed;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.IsSpecial(id)) allowed.push_back(id);
  }
  if (allowed.empty()) return InvalidArgumentError("the tokenizer has no non-special tokens");
  const auto [in_low, in_high] = RandomLengthBounds(o.input_len, o.range_ratio, 1);
  const auto [out_low, out_high] = RandomLengthBounds(o.output_len, o.range_ratio, 1);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int64_t> in_len(in_low, in_high), out_len(out_low, out_high);
  std::uniform_int_distribution<size_t> token(0, allowed.size() - 1);
  std::vector<SampleRequest> out(static_cast<size_t>(o.num_prompts));
  for (SampleRequest& r : out) {
    r.prompt_ids.resize(static_cast<size_t>(in_len(rng)));
    for (int32_t& id : r.prompt_ids) id = allowed[token(rng)];
    r.output_len = out_len(rng);
  }
  return out;
}

}  // namespace specula::loadgen
