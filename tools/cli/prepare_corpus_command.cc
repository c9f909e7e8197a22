// specula prepare-corpus: build the training corpus from Python sources, train the byte-level BPE
// tokenizer on its train split, and write token files for train / validation / held-out (test/).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/tokenizer/bpe_trainer.h"
#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "common/train/corpus.h"
#include "common/train/token_file.h"
#include "common/util/mapped_file.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"

namespace specula::cli {
namespace {

constexpr char kCommand[] = "prepare-corpus";
constexpr char kEndOfText[] = "<|endoftext|>";

struct Flags {
  std::string source = "/usr/lib/python3.11";
  std::string out = "data/corpus";
  int64_t vocab_size = 4096;
  int64_t validation_percent = 2;
  std::string tokenizer;  // reuse an existing tokenizer.json instead of training one
};

Status Run(const Flags& f) {
  namespace fs = std::filesystem;
  CorpusOptions co;
  co.root = f.source;
  co.validation_percent = static_cast<int>(f.validation_percent);
  ASSIGN_OR_RETURN(std::vector<CorpusFile> files, ListCorpus(co));
  fs::create_directories(f.out);

  std::vector<std::string> texts[3];
  int64_t bytes[3] = {0, 0, 0};
  nlohmann::json listing = {{"train", nlohmann::json::array()},
                            {"validation", nlohmann::json::array()},
                            {"held_out", nlohmann::json::array()}};
  const char* split_names[3] = {"train", "validation", "held_out"};
  for (const CorpusFile& file : files) {
    auto text = ReadFileToString((fs::path(f.source) / file.relative_path).string());
    if (!text.ok()) return text.status();
    const int s = static_cast<int>(file.split);
    bytes[s] += static_cast<int64_t>(text->size());
    texts[s].push_back(std::move(*text));
    listing[split_names[s]].push_back(file.relative_path);
  }
  std::fprintf(stderr, "corpus: %zu train files (%.1f MB), %zu validation, %zu held-out\n",
               texts[0].size(), bytes[0] / 1e6, texts[1].size(), texts[2].size());

  const std::string tok_path = (fs::path(f.out) / "tokenizer.json").string();
  if (!f.tokenizer.empty()) {
    ASSIGN_OR_RETURN(std::string json, ReadFileToString(f.tokenizer));
    RETURN_IF_ERROR(WriteStringToFile(tok_path, json));
  } else {
    BpeTrainerOptions to;
    to.vocab_size = static_cast<int>(f.vocab_size);
    to.special_tokens = {kEndOfText};
    ASSIGN_OR_RETURN(std::string json, TrainByteLevelBpe(texts[0], to));
    RETURN_IF_ERROR(WriteStringToFile(tok_path, json));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromFile(tok_path));
  auto eot = tok->TokenToId(kEndOfText);
  if (!eot) return InvalidArgumentError(StrCat(tok_path, ": has no ", kEndOfText, " token"));

  nlohmann::json manifest = {
      {"source", f.source},
      {"held_out_dir", co.held_out_dir},
      {"validation_percent", f.validation_percent},
      {"vocab_size", tok->vocab_size()},
      {"end_of_text_id", *eot},
      {"format", "little-endian uint16 token ids; documents separated by end_of_text_id"},
      {"files", listing}};
  const char* file_names[3] = {"train.tok", "val.tok", "heldout.tok"};
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> ids;
    for (const std::string& text : texts[s]) {
      auto piece = tok->Encode(text, /*add_special_tokens=*/false);
      ids.insert(ids.end(), piece.begin(), piece.end());
      ids.push_back(*eot);
    }
    RETURN_IF_ERROR(WriteTokenFile((fs::path(f.out) / file_names[s]).string(), ids));
    manifest["splits"][split_names[s]] = {{"file", file_names[s]},
                                          {"documents", texts[s].size()},
                                          {"bytes", bytes[s]},
                                          {"tokens", ids.size()}};
    std::fprintf(stderr, "%s: %zu tokens (%.2f bytes/token)\n", file_names[s], ids.size(),
                 ids.empty() ? 0.0 : double(bytes[s]) / ids.size());
  }
  return WriteStringToFile((fs::path(f.out) / "manifest.json").string(), manifest.dump(2) + "\n");
}

}  // namespace

int RunPrepareCorpus(const std::vector<std::string>& args) {
  Flags f;
  FlagSet flags(kCommand);
  flags.AddString("source", &f.source, "root of the Python sources (its test/ folder is held out)");
  flags.AddString("out", &f.out, "output directory");
  flags.AddInt("vocab-size", &f.vocab_size, "BPE vocabulary size to train");
  flags.AddInt("validation-percent", &f.validation_percent, "share of files for validation");
  flags.AddString("tokenizer", &f.tokenizer, "use this tokenizer.json instead of training one");
  return RunCommand(flags, args, [&] { return Run(f); });
}

}  // namespace specula::cli
