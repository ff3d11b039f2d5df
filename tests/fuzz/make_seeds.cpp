// fuzz_make_seeds OUT_DIR: writes the binary seed inputs of the targets whose input is a troupe
// encoding (envelope batches, Weights payloads, a checkpoint's state.json) into OUT_DIR/<target>/.
// Invariant: each seed is what troupe itself sends or saves, made with the encoders of the tree.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "troupe/actors/messages.h"
#include "troupe/actors/weight_codec.h"
#include "troupe/learner/checkpoint.h"
#include "troupe/runtime/envelope.h"

namespace {

using namespace troupe;
namespace fs = std::filesystem;

void write_file(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

template <class M>
std::string frame(const M& m, std::uint16_t flags = 0) {
  runtime::EnvelopeHeader h;
  h.sender = {0, 1};
  h.recipient = {1, 2};
  h.flags = flags;
  h.correlation = 7;
  return runtime::encode_frame(m, h);
}

void envelope_seeds(const fs::path& out) {
  actors::GenerateReq req;
  req.prompts = {"2+3=", "7*6="};
  req.prompt_tokens = {{1, 2, 3}};
  req.in_flight_steps = {1, 2};
  req.prompt_messages = {R"([{"role": "user", "content": "hi"}])"};
  actors::GenerateRep rep;
  actors::GenSample s;
  s.prompt_tokens = {1, 2};
  s.tokens = {5, 6, 7};
  s.logprobs = {-0.5f, -1.0f, -0.25f};
  s.text = "5";
  s.version_starts = {0, 2};
  s.versions = {3, 4};
  rep.samples = {s, s};
  actors::EnvObs obs;
  obs.text = "What is 2+3?";
  obs.metadata_json = R"({"answer": 5})";
  actors::TrainReq train;
  actors::TrainSample ts;
  ts.prompt = {1, 2};
  ts.completion = {3, 4, 5};
  ts.mask = {1, 1, 0};
  ts.old_logprobs = {-1, -2, -3};
  train.samples = {ts};
  actors::Ack ack;
  ack.detail = "applied";
  runtime::ErrorReply err{3, "no handler"};
  write_file(out / "generate_req", frame(req, runtime::kFlagRequest));
  write_file(out / "generate_rep", frame(rep, runtime::kFlagReply));
  write_file(out / "batch_obs_train_ack", frame(obs) + frame(train) + frame(ack) + frame(err));
  actors::Weights w;
  w.version = 2;
  w.params.assign(40, 0.5f);
  w.payload = runtime::Bytes(std::string(5000, 'w'));  // long enough to be shared with the input
  write_file(out / "weights_raw", frame(w));
}

// The fuzz target's model (weight_sync.fuzz.cpp): three tensors, 2000 values, bf16-rounded ramp.
void weight_sync_seeds(const fs::path& out) {
  const std::vector<policy::TensorSpec> tensors = {
      {"a.weight", {7, 100}, 0}, {"b.weight", {1000}, 700}, {"c.weight", {3, 100}, 1700}};
  std::vector<float> master(2000);
  for (size_t i = 0; i < master.size(); ++i) master[i] = actors::round_to_bf16(0.001f * static_cast<float>(i) - 0.5f);
  for (auto dtype : {actors::WeightDtype::fp32, actors::WeightDtype::bf16}) {
    const std::string tag(1, dtype == actors::WeightDtype::bf16 ? '\x01' : '\x00');
    const std::string name = dtype == actors::WeightDtype::bf16 ? "bf16" : "fp32";
    actors::WeightEncoder enc(dtype, tensors);
    actors::Weights w;
    enc.encode(master, 0, true, w);
    write_file(out / (name + "_full"), tag + runtime::encode_frame(w, {}).substr(runtime::kHeaderSize));
    std::vector<float> next = master;
    for (size_t i = 0; i < next.size(); i += 7) next[i] += 0.01f;
    enc.encode(next, 1, true, w);
    write_file(out / (name + "_delta"), tag + runtime::encode_frame(w, {}).substr(runtime::kHeaderSize));
  }
}

// The fuzz target's checkpoint (checkpoint_manifest.fuzz.cpp): its state.json as saved.
void checkpoint_seeds(const fs::path& out) {
  const fs::path root = fs::temp_directory_path() / ("troupe-fuzz-seeds-" + std::to_string(::getpid()));
  const std::vector<policy::TensorSpec> specs = {{"a.weight", {2, 3}, 0}, {"b.bias", {4}, 6}};
  std::vector<float> params(10);
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.25f * static_cast<float>(i);
  learner::AdamW opt(params.size());
  learner::CheckpointData data;
  data.step = 3;
  data.policy_version = 3;
  data.metric = 0.5;
  auto dir = learner::save_checkpoint(root.string(), data,
                                      learner::flat_model_writer(params, specs, {{"model_type", "flat"}}), opt, specs,
                                      learner::CheckpointOptions{0, "reward", true});
  if (!dir.ok()) {
    std::fprintf(stderr, "fuzz_make_seeds: %s\n", dir.error().message.c_str());
    std::exit(1);
  }
  std::ifstream in(fs::path(*dir) / "state.json", std::ios::binary);
  write_file(out / "state.json", std::string(std::istreambuf_iterator<char>(in), {}));
  fs::remove_all(root);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds OUT_DIR (tests/fuzz/corpus)\n");
    return 2;
  }
  const fs::path out = argv[1];
  envelope_seeds(out / "envelope");
  weight_sync_seeds(out / "weight_sync");
  checkpoint_seeds(out / "checkpoint_manifest");
  return 0;
}
