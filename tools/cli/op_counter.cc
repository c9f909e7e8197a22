#include "tools/cli/op_counter.h"

#include <cstdio>
#include <unordered_map>

namespace specula::cli {
namespace {

// The callback is a plain function: state lives here, one counter at a time on the thread.
thread_local int64_t t_count = 0;
thread_local bool t_print = false;
// Keyed by the name's address: an op's name is a string literal of its schema, so the pointer is
// stable and hashing it is cheap next to the op itself.
thread_local std::unordered_map<const char*, int64_t>* t_by_name = nullptr;

std::unique_ptr<at::ObserverContext> OnOp(const at::RecordFunction& fn) {
  ++t_count;
  if (t_by_name) ++(*t_by_name)[fn.name()];
  if (t_print) std::fprintf(stderr, "op %s\n", fn.name());
  return nullptr;
}

}  // namespace

OpCounter::OpCounter(bool print_each) {
  t_count = 0;
  t_print = print_each;
  delete t_by_name;
  t_by_name = new std::unordered_map<const char*, int64_t>();
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(OnOp).scopes({at::RecordScope::FUNCTION}));
}

OpCounter::~OpCounter() {
  at::removeCallback(handle_);
  delete t_by_name;
  t_by_name = nullptr;
}

int64_t OpCounter::count() const { return t_count; }

std::map<std::string, int64_t> OpCounter::by_name() const {
  std::map<std::string, int64_t> out;
  if (t_by_name) {
    for (const auto& [name, n] : *t_by_name) out[name] += n;
  }
  return out;
}

}  // namespace specula::cli
