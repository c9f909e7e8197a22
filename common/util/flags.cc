#include "common/util/flags.h"

#include <algorithm>
#include <charconv>
#include <sstream>

namespace specula {
namespace {

std::string JoinInts(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

StatusOr<std::vector<int64_t>> ParseIntList(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int64_t v = 0;
    auto res = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || res.ec != std::errc() || res.ptr != item.data() + item.size()) {
      return InvalidArgumentError(StrCat("'", item, "' is not an integer"));
    }
    out.push_back(v);
  }
  return out;
}

void FlagSet::AddString(const std::string& name, std::string* target, const std::string& help) {
  flags_[name] = {Kind::kString, target, help, *target, current_section_};
}
void FlagSet::AddInt(const std::string& name, int64_t* target, const std::string& help) {
  flags_[name] = {Kind::kInt, target, help, std::to_string(*target), current_section_};
}
void FlagSet::AddDouble(const std::string& name, double* target, const std::string& help) {
  flags_[name] = {Kind::kDouble, target, help, StrCat(*target), current_section_};
}
void FlagSet::AddBool(const std::string& name, bool* target, const std::string& help) {
  flags_[name] = {Kind::kBool, target, help, *target ? "true" : "false", current_section_};
}
void FlagSet::AddIntList(const std::string& name, std::vector<int64_t>* target,
                         const std::string& help) {
  flags_[name] = {Kind::kIntList, target, help, JoinInts(*target), current_section_};
}

int FlagSet::SectionIndex(const std::string& title) {
  auto it = std::find(sections_.begin(), sections_.end(), title);
  if (it != sections_.end()) return static_cast<int>(it - sections_.begin());
  sections_.push_back(title);
  return static_cast<int>(sections_.size()) - 1;
}

void FlagSet::Section(const std::string& title) { current_section_ = SectionIndex(title); }

void FlagSet::MoveToSection(const std::string& name, const std::string& title) {
  auto it = flags_.find(name);
  if (it != flags_.end()) it->second.section = SectionIndex(title);
}

Status FlagSet::SetDefault(const std::string& name, const std::string& value) {
  auto it = flags_.find(name);
  if (it == flags_.end()) return InvalidArgumentError(StrCat(command_, ": no flag --", name));
  RETURN_IF_ERROR(Assign(name, it->second, value));
  set_.erase(name);  // a default, not the user's choice
  it->second.default_text = value;
  return OkStatus();
}

Status FlagSet::Assign(const std::string& name, Flag& flag, const std::string& value) {
  auto bad = [&](const char* what) {
    return InvalidArgumentError(
        StrCat(command_, ": --", name, " expects ", what, ", got '", value, "'"));
  };
  switch (flag.kind) {
    case Kind::kString:
      *static_cast<std::string*>(flag.target) = value;
      break;
    case Kind::kInt: {
      int64_t v = 0;
      auto res = std::from_chars(value.data(), value.data() + value.size(), v);
      if (value.empty() || res.ec != std::errc() || res.ptr != value.data() + value.size())
        return bad("an integer");
      *static_cast<int64_t*>(flag.target) = v;
      break;
    }
    case Kind::kDouble: {
      try {
        size_t used = 0;
        double v = std::stod(value, &used);
        if (used != value.size()) return bad("a number");
        *static_cast<double*>(flag.target) = v;
      } catch (const std::exception&) {
        return bad("a number");
      }
      break;
    }
    case Kind::kBool:
      if (value == "true" || value == "1") {
        *static_cast<bool*>(flag.target) = true;
      } else if (value == "false" || value == "0") {
        *static_cast<bool*>(flag.target) = false;
      } else {
        return bad("true or false");
      }
      break;
    case Kind::kIntList: {
      auto list = ParseIntList(value);
      if (!list.ok()) return bad("comma-separated integers");
      *static_cast<std::vector<int64_t>*>(flag.target) = *list;
      break;
    }
  }
  set_[name] = true;
  return OkStatus();
}

Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      return InvalidArgumentError(StrCat(command_, ": unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      return InvalidArgumentError(StrCat(command_, ": unknown flag --", name, " (see --help)"));
    }
    if (!has_value) {
      if (it->second.kind == Kind::kBool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return InvalidArgumentError(StrCat(command_, ": --", name, " needs a value"));
      }
    }
    RETURN_IF_ERROR(Assign(name, it->second, value));
  }
  return OkStatus();
}

std::string FlagSet::Usage() const {
  std::ostringstream os;
  os << "usage: specula " << command_ << " [flags]\n";
  // Flags outside any section first, then each section in the order it was named.
  for (int section = -1; section < static_cast<int>(sections_.size()); ++section) {
    bool header = false;
    for (const auto& [name, flag] : flags_) {
      if (flag.section != section) continue;
      if (!header) {
        os << "\n" << (section < 0 ? "flags" : sections_[section]) << ":\n";
        header = true;
      }
      os << "  --" << name;
      if (flag.kind != Kind::kBool) os << " VALUE";
      os << "\n      " << flag.help;
      if (!flag.default_text.empty()) os << " (default: " << flag.default_text << ")";
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace specula
