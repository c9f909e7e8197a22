// Counts the LibTorch ops dispatched on this thread (every aten:: call, nested ones included) while
// an OpCounter lives: the per-op host overhead that bounds a small model's step, on CPU and above
// all on a GPU, where each op is a launch of ~2-5 us of host time.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <map>
#include <string>

namespace specula::cli {

class OpCounter {
 public:
  // print_each: every op's name to stderr as it runs.
  explicit OpCounter(bool print_each = false);
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;

  int64_t count() const;
  // Ops by name since construction.
  std::map<std::string, int64_t> by_name() const;

 private:
  at::CallbackHandle handle_;
};

}  // namespace specula::cli
