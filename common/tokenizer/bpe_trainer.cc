#include "common/tokenizer/bpe_trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/utf8.h"

namespace specula {
namespace {

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}
int32_t Left(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t Right(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

// A heap entry; entries go stale when counts drop and are re-checked when popped.
struct Candidate {
  int64_t count;
  uint64_t pair;
};
// Highest count first; among equal counts the smaller (left, right) pair, which makes training
// deterministic.
bool LowerPriority(const Candidate& a, const Candidate& b) {
  return a.count != b.count ? a.count < b.count : a.pair > b.pair;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Status Validate(const BpeTrainerOptions& options) {
  const size_t min_vocab = 256 + options.special_tokens.size();
  if (options.vocab_size < 0 || static_cast<size_t>(options.vocab_size) < min_vocab) {
    return InvalidArgumentError(StrCat("vocab_size ", options.vocab_size,
                                       " is smaller than the 256-byte alphabet plus ",
                                       options.special_tokens.size(), " special tokens"));
  }
  if (options.min_frequency < 1) {
    return InvalidArgumentError(
        StrCat("min_frequency must be at least 1, got ", options.min_frequency));
  }
  std::unordered_set<std::string_view> seen;
  for (const std::string& token : options.special_tokens) {
    if (token.empty() || !utf8::IsValid(token)) {
      return InvalidArgumentError(
          StrCat("special token '", token, "' must be non-empty, well-formed UTF-8"));
    }
    if (!seen.insert(token).second) {
      return InvalidArgumentError(StrCat("special token '", token, "' is listed twice"));
    }
  }
  return OkStatus();
}

// Distinct pre-tokens of all documents (raw bytes) with their counts, sorted by bytes.
std::vector<std::pair<std::string, int64_t>> CountWords(const std::vector<std::string>& documents,
                                                        const AddedVocabulary& specials,
                                                        const Regex& split) {
  std::unordered_map<std::string, int64_t> counts;
  std::vector<AddedVocabulary::Segment> segments;
  std::vector<std::pair<size_t, size_t>> matches;
  std::vector<std::pair<size_t, size_t>> pieces;
  for (const std::string& document : documents) {
    segments.clear();
    specials.Split(document, /*normalized=*/false, &segments);
    for (const auto& segment : segments) {
      if (segment.id >= 0) continue;
      const std::string_view text =
          std::string_view(document).substr(segment.begin, segment.end - segment.begin);
      matches.clear();
      pieces.clear();
      split.FindAll(text, &matches);
      SplitByMatches(text.size(), matches, SplitBehavior::kIsolated, false, &pieces);
      for (const auto& [begin, end] : pieces)
        ++counts[std::string(text.substr(begin, end - begin))];
    }
  }
  std::vector<std::pair<std::string, int64_t>> words(counts.begin(), counts.end());
  std::sort(words.begin(), words.end());
  return words;
}

// tokenizer.json text in the layout Hugging Face writes; vocab and merges one entry per line.
std::string WriteTokenizerJson(const BpeTrainerOptions& options,
                               const std::vector<std::string>& tokens,
                               const std::vector<std::pair<int32_t, int32_t>>& merges) {
  using Json = nlohmann::ordered_json;
  const auto quote = [](const std::string& s) { return Json(s).dump(); };
  Json added_tokens = Json::array();
  for (size_t i = 0; i < options.special_tokens.size(); ++i) {
    added_tokens.push_back(Json{{"id", i},
                                {"content", options.special_tokens[i]},
                                {"single_word", false},
                                {"lstrip", false},
                                {"rstrip", false},
                                {"normalized", false},
                                {"special", true}});
  }
  const Json pre_tokenizer = {
      {"type", "Sequence"},
      {"pretokenizers", Json::array({Json{{"type", "Split"},
                                          {"pattern", Json{{"Regex", options.pattern}}},
                                          {"behavior", "Isolated"},
                                          {"invert", false}},
                                     Json{{"type", "ByteLevel"},
                                          {"add_prefix_space", false},
                                          {"trim_offsets", true},
                                          {"use_regex", false}}})}};
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}};

  std::string out;
  out += "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  out += "  \"added_tokens\": " + added_tokens.dump() + ",\n";
  out += "  \"normalizer\": null,\n";
  out += "  \"pre_tokenizer\": " + pre_tokenizer.dump() + ",\n";
  out += "  \"post_processor\": " + byte_level.dump() + ",\n";
  out += "  \"decoder\": " + byte_level.dump() + ",\n";
  out +=
      "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
      "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
      "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n"
      "    \"vocab\": {\n";
  for (size_t id = 0; id < tokens.size(); ++id) {
    out += "      " + quote(tokens[id]) + ": " + std::to_string(id);
    out += id + 1 < tokens.size() ? ",\n" : "\n";
  }
  out += "    },\n    \"merges\": [\n";
  for (size_t i = 0; i < merges.size(); ++i) {
    out += "      " + quote(tokens[merges[i].first] + " " + tokens[merges[i].second]);
    out += i + 1 < merges.size() ? ",\n" : "\n";
  }
  out += "    ]\n  }\n}\n";
  return out;
}

}  // namespace

StatusOr<std::string> TrainByteLevelBpe(const std::vector<std::string>& documents,
                                        const BpeTrainerOptions& options) {
  RETURN_IF_ERROR(Validate(options));
  auto split = Regex::Compile(options.pattern);
  if (!split.ok()) return split.status().WithContext("pattern");
  const auto start_time = std::chrono::steady_clock::now();

  // Special tokens get ids 0..n-1 and are cut out of the documents before counting.
  std::vector<std::string> tokens;
  std::vector<AddedToken> special_tokens;
  for (const std::string& content : options.special_tokens) {
    special_tokens.push_back(
        {.id = static_cast<int32_t>(tokens.size()), .content = content, .special = true});
    tokens.push_back(content);
  }
  const AddedVocabulary specials(std::move(special_tokens));
  const auto first_byte_id = static_cast<int32_t>(tokens.size());
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(byte_level::ByteToChar(static_cast<uint8_t>(b)));
  }

  const std::vector<std::pair<std::string, int64_t>> counted =
      CountWords(documents, specials, *split);
  std::vector<std::vector<int32_t>> words(counted.size());
  std::vector<int64_t> word_counts(counted.size());
  for (size_t w = 0; w < counted.size(); ++w) {
    for (char c : counted[w].first) words[w].push_back(first_byte_id + static_cast<uint8_t>(c));
    word_counts[w] = counted[w].second;
  }
  if (options.show_progress) {
    std::cerr << "bpe trainer: " << documents.size() << " documents, " << words.size()
              << " distinct pre-tokens (" << SecondsSince(start_time) << " s)\n";
  }

  // Pair counts weighted by word frequency, and for each pair the words that may contain it
  // (entries can be stale: a word is re-checked when the pair is merged).
  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;
  const auto note_pair = [&](uint64_t pair, int64_t count, int32_t word) {
    pair_counts[pair] += count;
    std::vector<int32_t>& in = pair_words[pair];
    if (in.empty() || in.back() != word) in.push_back(word);
  };
  for (size_t w = 0; w < words.size(); ++w) {
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      note_pair(PairKey(words[w][i], words[w][i + 1]), word_counts[w], static_cast<int32_t>(w));
    }
  }
  std::vector<Candidate> heap;
  heap.reserve(pair_counts.size());
  for (const auto& [pair, count] : pair_counts) heap.push_back({count, pair});
  std::make_heap(heap.begin(), heap.end(), LowerPriority);

  std::vector<std::pair<int32_t, int32_t>> merges;
  const size_t target_merges = options.vocab_size - tokens.size();
  std::vector<uint64_t> increased;
  while (tokens.size() < static_cast<size_t>(options.vocab_size) && !heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), LowerPriority);
    const Candidate top = heap.back();
    heap.pop_back();
    const auto count_it = pair_counts.find(top.pair);
    const int64_t current = count_it == pair_counts.end() ? 0 : count_it->second;
    if (current != top.count) {
      if (current > 0) {
        heap.push_back({current, top.pair});
        std::push_heap(heap.begin(), heap.end(), LowerPriority);
      }
      continue;
    }
    if (current < options.min_frequency) break;

    const int32_t left = Left(top.pair);
    const int32_t right = Right(top.pair);
    const auto merged = static_cast<int32_t>(tokens.size());
    tokens.push_back(tokens[left] + tokens[right]);
    merges.emplace_back(left, right);
    pair_counts.erase(top.pair);
    std::vector<int32_t> affected = std::move(pair_words[top.pair]);
    pair_words.erase(top.pair);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());

    // Rewrite each word left to right. Every merge retires the pairs it breaks and creates pairs
    // with the new symbol; changes to the merged pair itself are moot, it no longer exists.
    increased.clear();
    for (const int32_t w : affected) {
      std::vector<int32_t>& symbols = words[w];
      const int64_t count = word_counts[w];
      const auto retire = [&](uint64_t pair) {
        if (pair != top.pair) pair_counts[pair] -= count;
      };
      const auto create = [&](uint64_t pair) {
        note_pair(pair, count, w);
        increased.push_back(pair);
      };
      size_t out = 0;
      for (size_t i = 0; i < symbols.size();) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          if (out > 0) {
            retire(PairKey(symbols[out - 1], left));
            create(PairKey(symbols[out - 1], merged));
          }
          if (i + 2 < symbols.size()) {
            retire(PairKey(right, symbols[i + 2]));
            create(PairKey(merged, symbols[i + 2]));
          }
          symbols[out++] = merged;
          i += 2;
        } else {
          symbols[out++] = symbols[i++];
        }
      }
      symbols.resize(out);
    }
    std::sort(increased.begin(), increased.end());
    increased.erase(std::unique(increased.begin(), increased.end()), increased.end());
    for (const uint64_t pair : increased) {
      const int64_t count = pair_counts[pair];
      if (count <= 0) continue;
      heap.push_back({count, pair});
      std::push_heap(heap.begin(), heap.end(), LowerPriority);
    }
    if (options.show_progress && merges.size() % 1000 == 0) {
      std::cerr << "bpe trainer: " << merges.size() << "/" << target_merges << " merges ("
                << SecondsSince(start_time) << " s)\n";
    }
  }
  if (options.show_progress) {
    std::cerr << "bpe trainer: done, vocab " << tokens.size() << ", " << merges.size()
              << " merges (" << SecondsSince(start_time) << " s)\n";
  }
  return WriteTokenizerJson(options, tokens, merges);
}

}  // namespace specula
