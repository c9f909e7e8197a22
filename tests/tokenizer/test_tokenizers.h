// Small hand-built tokenizer.json documents shared by the tokenizer tests. Ids are chosen so that
// expected encodings can be checked by hand.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/tokenizer/byte_level.h"

namespace specula::testing {

// Byte-level BPE (GPT-2 layout): byte b is id b (its byte-level character), then
//   256 "th", 257 "the", 258 "Ġc", 259 "at", 260 "Ġcat" (merge ranks in that order),
//   261 "<|endoftext|>" (special added token).
// The ByteLevel pre-tokenizer splits with the GPT-2 regex.
inline nlohmann::json ByteLevelTestConfig() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[std::string(byte_level::ByteToChar(b))] = b;
  const std::vector<std::pair<std::string, int>> merged = {
      {"th", 256}, {"the", 257}, {"\u0120c", 258}, {"at", 259}, {"\u0120cat", 260}};
  for (const auto& [token, id] : merged) vocab[token] = id;
  return {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 261},
         {"content", "<|endoftext|>"},
         {"single_word", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false},
         {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", false}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", {"t h", "th e", "\u0120 c", "a t", "\u0120c at"}}}},
  };
}

// SentencePiece-style BPE (Llama-2 layout): Prepend("▁") + Replace(" ", "▁") normalizer, no
// pre-tokenizer, byte_fallback, BOS via TemplateProcessing, decoder
// Replace/ByteFallback/Fuse/Strip.
//   0 "<unk>", 1 "<s>", 2 "</s>", 3 + b "<0xBB>" for every byte b,
//   259 "▁", 260 "h", 261 "e", 262 "l", 263 "o", 264 "w", 265 "r", 266 "d",
//   267 "▁h", 268 "ll", 269 "▁he", 270 "▁hell", 271 "▁hello", 272 "▁w", 273 "or".
inline nlohmann::json SentencePieceTestConfig() {
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  const std::vector<std::string> tokens = {
      "\u2581",  "h",  "e",        "l",          "o",           "w",       "r", "d",
      "\u2581h", "ll", "\u2581he", "\u2581hell", "\u2581hello", "\u2581w", "or"};
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = 259 + static_cast<int>(i);
  // Merges as [left, right] pairs (the newer format); built as explicit arrays, since nlohmann
  // would read a list of string pairs as an object.
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [left, right] :
       std::vector<std::pair<std::string, std::string>>{{"\u2581", "h"},
                                                        {"l", "l"},
                                                        {"\u2581h", "e"},
                                                        {"\u2581he", "ll"},
                                                        {"\u2581hell", "o"},
                                                        {"\u2581", "w"},
                                                        {"o", "r"}}) {
    merges.push_back(nlohmann::json::array({left, right}));
  }
  const auto added = [](int id, const char* content) {
    return nlohmann::json{{"id", id},        {"content", content}, {"single_word", false},
                          {"lstrip", false}, {"rstrip", false},    {"normalized", false},
                          {"special", true}};
  };
  return {
      {"version", "1.0"},
      {"added_tokens", {added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\u2581"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", nlohmann::json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", merges}}},
  };
}

}  // namespace specula::testing
