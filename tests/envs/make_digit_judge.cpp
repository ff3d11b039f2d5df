// Writes the digit judge (digit_judge.h) for envs.judge_model_run.  Usage: make_digit_judge OUT_DIR
#include <cstdio>

#include "digit_judge.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  auto dir = troupe::test_fixtures::save_digit_judge(argv[1]);
  if (!dir.ok()) {
    std::fprintf(stderr, "make_digit_judge: %s\n", dir.error().message.c_str());
    return 1;
  }
  std::printf("%s\n", dir->c_str());
  return 0;
}
