// The `troupe` subcommands. Each add_*_command registers its CLI11 subcommand and returns the
// function that runs it; main() calls the one the user picked and exits with its code
// (0 ok, 2 bad config/input, 3 a peer or rank failed, 1 anything else — docs/architecture.md).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "troupe/base/result.h"

namespace troupe::launch {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_run_command(CLI::App& root);        // cmd_run.cpp:   troupe run CONFIG [--set k=v]... [--resume DIR]
Command add_validate_command(CLI::App& root);   // cmd_run.cpp:   troupe validate CONFIG
Command add_eval_command(CLI::App& root);       // cmd_run.cpp:   troupe eval CONFIG --checkpoint DIR
Command add_report_command(CLI::App& root);     // cmd_report.cpp: troupe report RUN_DIR
Command add_bench_command(CLI::App& root);      // cmd_bench.cpp: troupe bench SUITE [--quick]
Command add_env_command(CLI::App& root);        // cmd_env.cpp:   troupe env serve (PLUGIN.so|BUILTIN) --bind ADDR
Command add_generate_command(CLI::App& root);   // cmd_model.cpp: troupe generate DIR --prompt TEXT ...
Command add_score_command(CLI::App& root);      // cmd_model.cpp: troupe score DIR (--tokens ...|--text ...)
Command add_keygen_command(CLI::App& root);     // cmd_keygen.cpp: troupe keygen PUBLIC SECRET (cluster.curve)
Command add_import_command(CLI::App& root);     // cmd_import.cpp: troupe import MODEL.gguf OUT_DIR [--dtype f32|bf16]
Command add_export_command(CLI::App& root);     // cmd_export.cpp: troupe export CKPT OUT_DIR [--merge] [--base PATH] (LoRA)
Command add_join_command(CLI::App& root);       // cmd_join.cpp:  troupe join RUN_DIR|ADDRESS --role generator|scorer
Command add_status_command(CLI::App& root);     // cmd_status.cpp: troupe status RUN_DIR|ADDRESS [--json]
Command add_serve_command(CLI::App& root);
Command add_checkpoint_command(CLI::App& root); // cmd_checkpoint.cpp: troupe checkpoint consolidate CKPT OUT_DIR
Command add_plan_command(CLI::App& root);       // cmd_plan.cpp:  troupe plan CONFIG [--device-memory 80GiB] [--json]      // cmd_serve.cpp: troupe serve MODEL --bind HOST:PORT (OpenAI API)

// --base-dtype NAME of generate, score and serve (QLoRA's policy.base_dtype for sampling; cmd_model.cpp).
void add_base_dtype_option(CLI::App* app, std::string& value);

// Prints an error the way every subcommand does ("troupe: error: ...") and returns its exit code.
int report_error(const Error& error);

}  // namespace troupe::launch
