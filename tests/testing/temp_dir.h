// A fresh directory for one test's files.
#pragma once

#include <filesystem>
#include <string>

namespace specula {

// A new, empty directory under std::filesystem::temp_directory_path(), named from the process id,
// the running gtest test (or test suite, in SetUpTestSuite) and a counter, so that tests running
// side by side never share one. It is removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The path of `name` inside the directory (the file itself is not created).
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace specula
