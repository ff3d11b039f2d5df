// `troupe report RUN_DIR`: writes RUN_DIR/report.png (reward and eval accuracy by step).
#include <memory>

#include "troupe/launch/commands.h"

namespace troupe::launch {

Command add_report_command(CLI::App& root) {
  auto dir = std::make_shared<std::string>();
  auto* app = root.add_subcommand("report", "Plot reward and eval accuracy of a run to RUN_DIR/report.png");
  app->add_option("run_dir", *dir, "Run directory")->required();
  return {app, [dir]() { return report_error(make_error(ErrorCode::internal, "troupe report is not implemented yet")); }};
}

}  // namespace troupe::launch
