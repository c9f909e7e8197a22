#include "tests/train/tiny_distill.h"

#include <random>

#include "common/engine/plain_decoder.h"
#include "common/model/model_runner.h"
#include "common/train/distill_dataset.h"
#include "tests/testing/tiny_model.h"

namespace specula {

std::vector<int32_t> RandomTokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % TinyModelConfig().vocab_size);
  return t;
}

StatusOr<std::vector<std::vector<int32_t>>> WriteTinyTargetAndDistill(
    const std::string& target_dir, const std::string& distill_path, int records,
    int max_new_tokens) {
  const ModelConfig config = TinyModelConfig();
  auto module = MakeTinyModel(config, 3, /*weight_scale=*/4.0);
  RETURN_IF_ERROR(SaveModelDir(*module, config, target_dir));
  ASSIGN_OR_RETURN(auto runner, ModelRunner::FromModule(module, {}));
  size_t present = 0;
  ASSIGN_OR_RETURN(auto writer,
                   DistillWriter::OpenForAppend(
                       distill_path, static_cast<uint32_t>(config.vocab_size), &present));
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < records; ++i) {
    GenerationRequest r{.prompt = RandomTokens(4 + i % 7, 100 + i),
                        .max_new_tokens = max_new_tokens};
    ASSIGN_OR_RETURN(auto out, DecodeBatch(*runner, {r}));
    RETURN_IF_ERROR(writer->Append(r.prompt, out[0].tokens));
    prompts.push_back(r.prompt);
  }
  return prompts;
}

}  // namespace specula
