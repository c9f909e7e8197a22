// Command-line flags for the specula tools: --name=value, --name value, and --flag for booleans.
//
// Tools must build against LibTorch alone (no Abseil on GPU machines), hence this small parser.
// Unknown flags, missing values and unparsable numbers are errors naming the flag.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/util/status.h"

namespace specula {

class FlagSet {
 public:
  explicit FlagSet(std::string command) : command_(std::move(command)) {}

  void AddString(const std::string& name, std::string* target, const std::string& help);
  void AddInt(const std::string& name, int64_t* target, const std::string& help);
  void AddDouble(const std::string& name, double* target, const std::string& help);
  void AddBool(const std::string& name, bool* target, const std::string& help);
  // Comma-separated integers, e.g. --batch-sizes 1,4,16.
  void AddIntList(const std::string& name, std::vector<int64_t>* target, const std::string& help);

  // Parses args (without the program and command names). INVALID_ARGUMENT naming the flag.
  Status Parse(const std::vector<std::string>& args);
  bool help_requested() const { return help_; }
  bool WasSet(const std::string& name) const { return set_.count(name) > 0; }
  std::string Usage() const;
  const std::string& command() const { return command_; }

 private:
  enum class Kind { kString, kInt, kDouble, kBool, kIntList };
  struct Flag {
    Kind kind;
    void* target;
    std::string help;
    std::string default_text;
  };
  Status Assign(const std::string& name, Flag& flag, const std::string& value);

  std::string command_;
  std::map<std::string, Flag> flags_;
  std::map<std::string, bool> set_;
  bool help_ = false;
};

StatusOr<std::vector<int64_t>> ParseIntList(const std::string& text);

}  // namespace specula
