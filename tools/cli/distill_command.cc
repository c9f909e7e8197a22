// specula distill: build the self-distillation dataset (prompts from the training split, greedy
// continuations by the target) that drafters train on. Resumable: run the same command again.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/tokenizer/tokenizer.h"
#include "common/train/distill_dataset.h"
#include "common/train/distiller.h"
#include "common/util/mapped_file.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"

namespace specula::cli {
namespace {

constexpr char kCommand[] = "distill";

struct Flags {
  ModelFlags model;
  std::string data = "data/corpus";
  DistillOptions distill;
};

Status Run(Flags f) {
  namespace fs = std::filesystem;
  if (f.distill.out_path.empty()) return InvalidArgumentError("--out is required");
  ASSIGN_OR_RETURN(TokenFile train, TokenFile::Open((fs::path(f.data) / "train.tok").string()));
  ASSIGN_OR_RETURN(auto tok,
                   Tokenizer::FromFile((fs::path(f.model.model) / "tokenizer.json").string()));
  // Line starts: prompts begin right after a token whose text ends in a newline.
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    auto text = tok->DecodeBytes({id});
    if (text.ok() && !text->empty() && text->back() == '\n') f.distill.line_end_ids.insert(id);
  }
  if (auto eot = tok->TokenToId("<|endoftext|>")) f.distill.end_of_text_id = *eot;
  ASSIGN_OR_RETURN(auto runner, f.model.Load());
  ASSIGN_OR_RETURN(int64_t records, RunDistillation(*runner, train, f.distill));
  ASSIGN_OR_RETURN(DistillDataset d, DistillDataset::Open(f.distill.out_path));
  nlohmann::json info = {
      {"model", f.model.model},
      {"records", records},
      {"response_tokens", d.total_response_tokens()},
      {"seed", f.distill.seed},
      {"prompt_tokens", {f.distill.min_prompt_tokens, f.distill.max_prompt_tokens}},
      {"max_response_tokens", f.distill.response_tokens}};
  std::cout << info.dump() << "\n";
  return OkStatus();
}

}  // namespace

int RunDistill(const std::vector<std::string>& args) {
  Flags f;
  f.distill.out_path = "data/distill.bin";
  FlagSet flags(kCommand);
  f.model.Register(flags);
  flags.AddString("data", &f.data, "prepared corpus directory (its train.tok gives the prompts)");
  flags.AddString("out", &f.distill.out_path, "dataset file (appended to when it exists)");
  flags.AddInt("num-prompts", &f.distill.num_prompts, "records in the finished dataset");
  flags.AddInt("min-prompt-tokens", &f.distill.min_prompt_tokens, "shortest prompt");
  flags.AddInt("max-prompt-tokens", &f.distill.max_prompt_tokens, "longest prompt");
  flags.AddInt("response-tokens", &f.distill.response_tokens,
               "tokens generated per prompt at most");
  flags.AddInt("batch-size", &f.distill.batch_size, "prompts generated together");
  int64_t seed = 0;
  flags.AddInt("seed", &seed, "prompt sampling seed");
  return RunCommand(flags, args, [&] {
    f.distill.seed = static_cast<uint64_t>(seed);
    return Run(f);
  });
}

}  // namespace specula::cli
