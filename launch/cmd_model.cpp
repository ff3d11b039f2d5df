// `troupe generate` and `troupe score`: sample from / score with a model directory (DESIGN.md).
#include <memory>

#include "troupe/launch/commands.h"

namespace troupe::launch {

Command add_generate_command(CLI::App& root) {
  struct Opts {
    std::string dir, prompt;
    int max_tokens = 64;
    double temperature = 1.0;
    uint64_t seed = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("generate", "Sample a completion from a model directory");
  app->add_option("dir", o->dir, "Model directory")->required();
  app->add_option("--prompt", o->prompt, "Prompt text")->required();
  app->add_option("--max-tokens", o->max_tokens, "Most new tokens")->check(CLI::Range(1, 1 << 20));
  app->add_option("--temperature", o->temperature, "Sampling temperature (0 = greedy)")->check(CLI::Range(0.0, 100.0));
  app->add_option("--seed", o->seed, "RNG seed");
  return {app, [o]() { return report_error(make_error(ErrorCode::internal, "troupe generate is not implemented yet")); }};
}

Command add_score_command(CLI::App& root) {
  struct Opts {
    std::string dir, tokens, text;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("score", "Log-prob of each token given those before it, as JSON");
  app->add_option("dir", o->dir, "Model directory")->required();
  auto* t = app->add_option("--tokens", o->tokens, "Comma-separated token ids, e.g. 1,2,3");
  auto* x = app->add_option("--text", o->text, "Text to tokenize and score");
  t->excludes(x);
  return {app, [o]() { return report_error(make_error(ErrorCode::internal, "troupe score is not implemented yet")); }};
}

}  // namespace troupe::launch
