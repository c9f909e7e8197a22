// The training corpus: Python sources under a root (Debian's /usr/lib/python3.11), with the root's
// test/ folder held out for evaluation and a deterministic train/validation split by file path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/util/status.h"

namespace specula {

enum class CorpusSplit { kTrain, kValidation, kHeldOut };

struct CorpusFile {
  std::string relative_path;  // e.g. "json/decoder.py"
  CorpusSplit split;
};

struct CorpusOptions {
  std::string root = "/usr/lib/python3.11";
  std::string held_out_dir = "test";  // relative to root; never used for training
  int validation_percent = 2;         // of the non-held-out files, chosen by path hash
  // Skipped everywhere: third-party packages that may be installed under the root.
  std::vector<std::string> excluded_dirs = {"site-packages", "dist-packages"};
};

// Sorted by path. NOT_FOUND if the root does not exist or holds no .py file.
StatusOr<std::vector<CorpusFile>> ListCorpus(const CorpusOptions& options);

// The split a path falls in (FNV-1a of the relative path, so it never depends on the machine).
CorpusSplit SplitOf(const std::string& relative_path, const CorpusOptions& options);

}  // namespace specula
