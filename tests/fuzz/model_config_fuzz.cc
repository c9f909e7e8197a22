// Fuzzes config.json parsing (ModelConfig::FromJson): any bytes give a config or an error, never a
// crash; a config that parses has positive sizes.
#include <cstdint>

#include "common/model/model_config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specula;
  auto config = ModelConfig::FromJson(fuzz::AsText(data, size), "config.json");
  if (!config.ok()) {
    if (config.status().message().empty()) fuzz::Fail("an error without a message");
    return 0;
  }
  if (config->vocab_size <= 0 || config->hidden_size <= 0 || config->num_hidden_layers <= 0) {
    fuzz::Fail("a config with a non-positive size");
  }
  return 0;
}
