// Fuzzes safetensors parsing (SafetensorsFile::Open on an in-memory file): any bytes give a file or
// an error naming it, never a crash or a read outside the data; every tensor of a file that opens
// lies inside it and holds exactly numel * dtype-size bytes.
#include <cstdint>

#include "common/model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specula;
  fuzz::MemoryFile file(fuzz::AsText(data, size));
  auto opened = SafetensorsFile::Open(file.path());
  if (!opened.ok()) {
    if (opened.status().message().empty()) fuzz::Fail("an error without a message");
    return 0;
  }
  uint64_t sum = 0;
  for (const TensorView& t : (*opened)->tensors()) {
    if (t.nbytes != static_cast<size_t>(t.numel()) * DTypeSize(t.dtype)) {
      fuzz::Fail("nbytes != numel * dtype size");
    }
    // Touch every byte: ASan reports a view that reaches past the mapping.
    for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
    if ((*opened)->Find(t.name) == nullptr) fuzz::Fail("Find misses a listed tensor");
  }
  return sum == 0xdeadbeef ? 1 : 0;
}
