// Fuzz target: a checkpoint's manifest, state.json (learner/checkpoint.cpp), as --resume reads it:
// verify_checkpoint (every listed file's size and CRC-32), checkpoint_metric and load_checkpoint
// (AdamW moments by the tensor table). The input replaces state.json of a real step directory
// saved once per process (model.safetensors, config.json, optimizer.safetensors).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_input.h"
#include "troupe/learner/checkpoint.h"

namespace {

using namespace troupe;

const std::vector<policy::TensorSpec>& specs() {
  static const std::vector<policy::TensorSpec> s = {{"a.weight", {2, 3}, 0}, {"b.bias", {4}, 6}};
  return s;
}

// Saves checkpoints/step_3 under the scratch folder; returns the step directory.
std::string saved_step_dir() {
  const std::string root = troupe::fuzz::scratch_dir() + "/checkpoints";
  std::vector<float> params(10);
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.25f * static_cast<float>(i);
  learner::AdamW opt(params.size());
  learner::CheckpointData data;
  data.step = 3;
  data.policy_version = 3;
  data.metric = 0.5;
  auto dir = learner::save_checkpoint(root, data, learner::flat_model_writer(params, specs(), {{"model_type", "flat"}}),
                                      opt, specs(), learner::CheckpointOptions{0, "reward", true});
  if (!dir.ok()) std::abort();
  return *dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string step_dir = saved_step_dir();
  troupe::fuzz::write_scratch("checkpoints/" + std::filesystem::path(step_dir).filename().string() + "/state.json",
                              troupe::fuzz::as_text(data, size));
  (void)learner::verify_checkpoint(step_dir);
  (void)learner::checkpoint_metric(step_dir);
  learner::AdamW opt;
  (void)learner::load_checkpoint(step_dir, specs(), opt);
  return 0;
}
