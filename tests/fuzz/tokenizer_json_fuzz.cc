// Fuzzes tokenizer.json loading (Tokenizer::FromJson): any bytes give a tokenizer or an error,
// never a crash; a tokenizer that loads must encode and decode a fixed text and the input itself.
#include <cstdint>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specula;
  const std::string_view json = fuzz::AsText(data, size);
  auto tokenizer = Tokenizer::FromJson(json, "tokenizer.json");
  if (!tokenizer.ok()) {
    if (tokenizer.status().message().empty()) fuzz::Fail("an error without a message");
    return 0;
  }
  const Tokenizer& t = **tokenizer;
  for (std::string_view text : {std::string_view("Hello world, the cat\n\t  x"),
                                json.substr(0, std::min<size_t>(json.size(), 256))}) {
    const std::vector<int32_t> ids = t.Encode(text);
    for (int32_t id : ids) {
      if (id < 0) fuzz::Fail("a negative token id");
    }
    (void)t.Decode(ids);
    (void)t.Decode(ids, /*skip_special_tokens=*/true);
  }
  return 0;
}
