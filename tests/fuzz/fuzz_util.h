// Helpers shared by the libFuzzer targets (tests/fuzz/README.md).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace specula::fuzz {

inline std::string_view AsText(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// A violated invariant: print and abort so that libFuzzer records the input as a crash.
[[noreturn]] inline void Fail(const char* what) {
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
  std::abort();
}

// An in-memory file holding `bytes`, for APIs that read paths. Closed on destruction.
class MemoryFile {
 public:
  explicit MemoryFile(std::string_view bytes) {
    fd_ = memfd_create("specula-fuzz", MFD_CLOEXEC);
    if (fd_ < 0 || write(fd_, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) {
      Fail("memfd_create/write");
    }
  }
  ~MemoryFile() { close(fd_); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};

}  // namespace specula::fuzz
