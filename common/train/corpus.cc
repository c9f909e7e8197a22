#include "common/train/corpus.h"

#include <algorithm>
#include <filesystem>

namespace specula {

namespace fs = std::filesystem;

CorpusSplit SplitOf(const std::string& rel, const CorpusOptions& o) {
  if (rel == o.held_out_dir || rel.rfind(o.held_out_dir + "/", 0) == 0)
    return CorpusSplit::kHeldOut;
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : rel) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int>(h % 100) < o.validation_percent ? CorpusSplit::kValidation
                                                          : CorpusSplit::kTrain;
}

StatusOr<std::vector<CorpusFile>> ListCorpus(const CorpusOptions& o) {
  std::error_code ec;
  if (!fs::is_directory(o.root, ec))
    return NotFoundError(StrCat("corpus root not found: ", o.root));
  std::vector<CorpusFile> files;
  for (auto it = fs::recursive_directory_iterator(
           o.root, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (it->is_directory() &&
        std::find(o.excluded_dirs.begin(), o.excluded_dirs.end(), name) != o.excluded_dirs.end()) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file() || it->path().extension() != ".py") continue;
    std::string rel = fs::relative(it->path(), o.root).generic_string();
    files.push_back({rel, SplitOf(rel, o)});
  }
  if (files.empty()) return NotFoundError(StrCat("no .py files under ", o.root));
  std::sort(files.begin(), files.end(),
            [](const auto& a, const auto& b) { return a.relative_path < b.relative_path; });
  return files;
}

}  // namespace specula
