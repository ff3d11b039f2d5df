// Test-only helper shared by the policy/io tests: per-process temporary directories that are
// removed when the test program ends (a gtest global environment), so tests leave nothing behind.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace troupe::policy::io::testing {

inline std::vector<std::filesystem::path>& temp_dirs() {
  static std::vector<std::filesystem::path> dirs;
  return dirs;
}

struct RemoveTempDirs : ::testing::Environment {
  void TearDown() override {
    for (const auto& d : temp_dirs()) std::filesystem::remove_all(d);
  }
};

// Registered at static initialization, before RUN_ALL_TESTS (as gtest requires).
inline ::testing::Environment* const remove_temp_dirs_env = ::testing::AddGlobalTestEnvironment(new RemoveTempDirs);

// A fresh empty directory "troupe_<prefix>_<name>_<pid>" under the system temp folder.
inline std::filesystem::path make_temp_dir(const std::string& prefix, const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("troupe_" + prefix + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  temp_dirs().push_back(d);
  return d;
}

}  // namespace troupe::policy::io::testing
