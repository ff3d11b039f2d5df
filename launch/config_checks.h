// The checks that need several keys of one experiment (model shape, execution options, envs,
// faults, placement, async, cluster), one function per config section. Each finding is reported
// with the key whose YAML position it points at, the key it is about, and the message.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "troupe/actors/experiment_config.h"

namespace troupe::launch {

// report(mark_key, key, message): mark_key is the key whose line and column the error shows.
using ConfigReport = std::function<void(const std::string& mark_key, const std::string& key, const std::string& message)>;

// architecture_keys_set: the policy.model.* keys the YAML or --set gave (an error with policy.path).
void check_config(const actors::ExperimentConfig& c, const std::vector<std::string>& architecture_keys_set,
                  const ConfigReport& report);

}  // namespace troupe::launch
