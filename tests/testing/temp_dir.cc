#include "tests/testing/temp_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <system_error>

namespace specula {

namespace fs = std::filesystem;

namespace {

// The running test's name ("Suite.Name", '/' of parameterized tests made '_'), the suite's name
// in SetUpTestSuite, else "x".
std::string CurrentTestName() {
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  std::string name = "x";
  if (const ::testing::TestInfo* info = unit.current_test_info()) {
    name = std::string(info->test_suite_name()) + "." + info->name();
  } else if (const ::testing::TestSuite* suite = unit.current_test_suite()) {
    name = suite->name();
  }
  for (char& ch : name) {
    if (ch == '/') ch = '_';
  }
  return name;
}

}  // namespace

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  path_ = fs::temp_directory_path() / ("specula_" + std::to_string(::getpid()) + "_" +
                                       std::to_string(counter++) + "_" + CurrentTestName());
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

}  // namespace specula
