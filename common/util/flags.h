// Command-line flags for the specula tools: --name=value, --name value, and --flag for booleans.
//
// Tools must build against LibTorch alone (no Abseil on GPU machines), hence this small parser.
// Unknown flags, missing values and unparsable numbers are errors naming the flag.
//
// --help lists the flags sorted by name, or grouped in sections when the command declares them:
//   flags.Section("router (--role router, all)");   // flags added from here on are listed there
//   flags.AddInt("max-queue", ...);
//   flags.MoveToSection("model", "all roles");       // a flag a shared helper registered
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

  // Flags added after this call are listed under `title` in Usage(). Sections are listed in the
  // order they were first named, after the flags added before any section ("flags:").
  void Section(const std::string& title);
  // Changes an already added flag's default (its value now and in Usage()), e.g. a command whose
  // default differs from a shared helper's. INVALID_ARGUMENT for an unknown flag or a bad value.
  Status SetDefault(const std::string& name, const std::string& value);
  // Lists an already added flag under `title` (for flags a shared helper registered). No-op for
  // an unknown name.
  void MoveToSection(const std::string& name, const std::string& title);

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
    int section = -1;  // index into sections_; -1 = none
  };
  int SectionIndex(const std::string& title);
  Status Assign(const std::string& name, Flag& flag, const std::string& value);

  std::string command_;
  std::map<std::string, Flag> flags_;
  std::map<std::string, bool> set_;
  std::vector<std::string> sections_;
  int current_section_ = -1;
  bool help_ = false;
};

StatusOr<std::vector<int64_t>> ParseIntList(const std::string& text);

}  // namespace specula
