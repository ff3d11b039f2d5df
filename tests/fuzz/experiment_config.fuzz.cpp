// Fuzz target: the experiment YAML (launch/config.cpp, config_schema.cpp, config_checks.cpp), as
// `troupe run|validate` reads it. The input is the file's text; its lines starting with "#set "
// are also given as --set overrides. An accepted config's resolved YAML must load back.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "troupe/launch/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::launch;
  const std::string text(troupe::fuzz::as_text(data, size));
  std::vector<std::string> sets;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("#set ", 0) == 0) sets.push_back(line.substr(5));
  auto loaded = load_config_text(text, "fuzz.yaml", sets);
  if (!loaded.ok()) return 0;
  const std::string resolved = resolved_yaml(loaded->config);
  if (!load_config_text(resolved, "resolved.yaml").ok()) std::abort();  // the run directory's copy must load
  return 0;
}
