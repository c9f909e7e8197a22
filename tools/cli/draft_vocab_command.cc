// specula draft-vocab: the draft vocabulary (common/drafters/draft_vocab.h) from a
// self-distillation dataset: the --size tokens the target emits most often in its responses, with
// their coverage.
#include <cstdio>

#include "common/drafters/draft_vocab.h"
#include "common/train/distill_dataset.h"
#include "common/util/mapped_file.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"

namespace specula::cli {
namespace {

constexpr char kCommand[] = "draft-vocab";

}  // namespace

int RunDraftVocab(const std::vector<std::string>& args) {
  std::string data = "data/distill.bin", out;
  int64_t size = 1024, val_records = 64;
  FlagSet flags(kCommand);
  flags.AddString("data", &data, "self-distillation dataset (specula distill)");
  flags.AddString("out", &out, "draft_vocab.json to write");
  flags.AddInt("size", &size, "tokens to keep, most frequent first");
  flags.AddInt("val-records", &val_records,
               "the dataset's last records, held out as the drafters' validation: not counted");
  return RunCommand(flags, args, [&]() -> Status {
    if (out.empty()) return InvalidArgumentError("--out is required");
    if (size <= 0) return InvalidArgumentError(StrCat("--size must be positive, got ", size));
    if (val_records < 0) {
      return InvalidArgumentError(StrCat("--val-records must be >= 0, got ", val_records));
    }
    auto dataset = DistillDataset::Open(data);
    if (!dataset.ok()) return dataset.status().WithContext("--data");
    const size_t records = dataset->size() > static_cast<size_t>(val_records)
                               ? dataset->size() - static_cast<size_t>(val_records)
                               : 0;
    if (records == 0) {
      return InvalidArgumentError(StrCat("--data ", data, ": no records besides the ", val_records,
                                         " held out (--val-records)"));
    }
    DraftVocab vocab = DraftVocab::FromCounts(ResponseTokenCounts(*dataset, records), size,
                                              StrCat(data, " (", records, " records)"));
    RETURN_IF_ERROR(vocab.Validate("--data: the counted responses"));
    if (Status s = WriteStringToFile(out, vocab.ToJson()); !s.ok()) return s.WithContext("--out");
    std::fprintf(stderr, "%s: %zu of %ld tokens cover %.4f of %ld response tokens\n", out.c_str(),
                 vocab.tokens.size(), vocab.vocab_size, vocab.coverage, vocab.counted_tokens);
    return OkStatus();
  });
}

}  // namespace specula::cli
