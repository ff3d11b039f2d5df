// Shared by the learner's PyTorch parity tests (learner.grpo_torch_parity, learner.mismatch_corrections):
// the JSON spellings they write and the run of grpo_reference.py over the cases.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/base/build_config.h"
#include "troupe/learner/loss.h"

namespace troupe::learner::testing {

inline nlohmann::json vec(const std::vector<float>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (float x : v) a.push_back(static_cast<double>(x));
  return a;
}

// The names the reference script reads (the YAML's choices, plus seq-mean-token-sum).
inline const char* name(LossAggMode m) {
  static const char* names[] = {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"};
  return names[static_cast<int>(m)];
}

// Writes {"cases": cases} to a temporary file named after `stem`, runs grpo_reference.py on it
// (single-threaded BLAS) and returns the script's exit code (1 when it could not run).
inline int run_torch_reference(const nlohmann::json& cases, const std::string& stem, const std::string& what) {
  const std::string path =
      (std::filesystem::temp_directory_path() / (stem + "_" + std::to_string(::getpid()) + ".json")).string();
  {
    std::ofstream f(path);
    f << nlohmann::json{{"cases", cases}}.dump();
  }
  std::printf("wrote %s to %s\n", what.c_str(), path.c_str());
  std::fflush(stdout);
  const std::string script = std::string(TROUPE_SOURCE_DIR) + "/tests/learner/grpo_reference.py";
  const std::string cmd = "OPENBLAS_NUM_THREADS=1 '" + troupe::python_executable() + "' '" + script + "' '" + path + "'";
  const int rc = std::system(cmd.c_str());
  std::filesystem::remove(path);
  if (rc == -1 || !WIFEXITED(rc)) {
    std::fprintf(stderr, "could not run %s\n", cmd.c_str());
    return 1;
  }
  return WEXITSTATUS(rc);
}

}  // namespace troupe::learner::testing
