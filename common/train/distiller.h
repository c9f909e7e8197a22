// Builds the self-distillation dataset: code prefixes sampled from the training split, continued
// greedily by the target model in batches, appended to a DistillWriter file.
//
// Prompt i depends only on (seed, i), so an interrupted run resumes where it stopped and produces
// the same file as an uninterrupted one.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "common/model/model_runner.h"
#include "common/train/token_file.h"
#include "common/util/status.h"

namespace specula {

struct DistillOptions {
  std::string out_path;
  int64_t num_prompts = 4000;
  int64_t min_prompt_tokens = 16;
  int64_t max_prompt_tokens = 128;
  int64_t response_tokens = 256;  // generated per prompt at most (stops at end of text)
  int64_t batch_size = 32;
  uint64_t seed = 0;
  int32_t end_of_text_id = -1;     // prompts never contain it; generation stops at it
  std::set<int32_t> line_end_ids;  // prompts start right after one of these (line starts)
  bool quiet = false;
};

// Prompt `index` of the dataset (token ids from `train`).
std::vector<int32_t> DistillPrompt(const TokenFile& train, const DistillOptions& options,
                                   int64_t index);

// Generates the records not yet in options.out_path. Returns the number of records in the file.
StatusOr<int64_t> RunDistillation(ModelRunner& target, const TokenFile& train,
                                  const DistillOptions& options);

}  // namespace specula
