// What the learner tests under tests/learner/ share: the tiny model they train, for the mpirun
// tests the world communicator, how far two runs' parameters are apart, and the whole weights of
// learners that hold one block of experts each, gathered to compare them (and written as the whole
// model's checkpoint directory).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <span>
#include <vector>

#include "troupe/learner/checkpoint.h"
#include "troupe/learner/communicator.h"
#include "troupe/learner/expert_parallel.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/model.h"

namespace troupe::learner::test {

// The tiny model: vocab 32, width 16, `layers` layers of 2 attention heads (1 KV head) of 8 and a
// dense MLP of 32; with `experts` > 0 the MLPs are MoE layers of that many experts, top-2, each of
// width 16 (the caller names dense layers in mlp_only_layers).
inline policy::ModelConfig tiny_model(int layers, int experts = 0) {
  policy::ModelConfig mc;
  mc.vocab_size = 32;
  mc.hidden_size = 16;
  mc.num_hidden_layers = layers;
  mc.num_attention_heads = 2;
  mc.num_key_value_heads = 1;
  mc.head_dim = 8;
  mc.intermediate_size = 32;
  if (experts > 0) {
    mc.num_experts = experts;
    mc.num_experts_per_tok = 2;
    mc.moe_intermediate_size = 16;
  }
  return mc;
}

// The learners' communicator over MPI_COMM_WORLD (MPI_Init done by the caller); the job aborts,
// naming the error, when it cannot be made.
inline std::unique_ptr<Communicator> mpi_world_or_abort() {
  auto comm = make_mpi_communicator();
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.error().message.c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return std::move(*comm);
}

// The largest |a[i] - b[i]| (infinity when the sizes differ): how far two runs' parameters are apart.
inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

// The whole weights of learners whose models hold one block of experts each (Model::slice_experts),
// on learner 0 into `whole` (the layout's whole_size floats; not read on the other learners): the
// first expert-parallel group's blocks, gathered over groups of their own (learner::gather_whole). A
// collective of every learner (troupe run gathers nothing: the weight sync and checkpoints go from
// the blocks).
inline Status gather_divided_weights(const policy::Model& model, Communicator& world, std::span<float> whole) {
  const policy::ExpertShardLayout* layout = model.expert_shards();
  if (!layout) return invalid_input("gather_divided_weights: the model holds every expert");
  TROUPE_ASSIGN_OR_RETURN(auto ep, ExpertParallel::join(world, layout->shards, model.backend()));
  if (world.rank() >= layout->shards) return {};  // (the first group's gather reaches learner 0)
  return gather_whole(model.params(), *layout, *ep, whole);
}

// The whole model's directory from the whole weights `whole` of a model holding one block of experts
// (laid out as its layout's whole_table), as policy_model_writer writes it for the whole model.
inline ModelDirWriter whole_model_writer(const policy::Model& model, std::span<const float> whole) {
  return [&model, whole](const std::string& dir) -> Status {
    policy::io::TensorMap named;
    for (const auto& s : model.expert_shards()->whole_table)
      named[s.name] = policy::io::Tensor{s.shape, std::vector<float>(whole.begin() + static_cast<std::ptrdiff_t>(s.offset),
                                                                     whole.begin() + static_cast<std::ptrdiff_t>(s.offset + s.numel()))};
    TROUPE_ASSIGN_OR_RETURN(auto tensors, policy::io::canonicalize_tensors(model.config(), named, "model"));
    return policy::io::save_model_dir(dir, model.config(), tensors, nullptr, policy::io::ExpertLayout::per_expert);
  };
}

// Divided learners' step-1 state as the whole model's checkpoint in `dir`: their gathered weights
// and AdamW moments, written by learner 0 (test::whole_model_writer); a collective of every learner.
// Returns the checkpoint's directory.
inline Result<std::string> save_gathered_checkpoint(const policy::Model& model, Trainer& tr, Communicator& world,
                                                    const std::string& dir) {
  std::vector<float> whole(model.expert_shards()->whole_size);
  TROUPE_TRY(gather_divided_weights(model, world, whole));
  TROUPE_ASSIGN_OR_RETURN(AdamW moments, tr.gathered_optimizer());
  if (world.rank() == 0) {
    CheckpointData d;
    d.step = 1;
    d.trainer_state = tr.state_json();
    auto saved = save_checkpoint(dir, d, whole_model_writer(model, whole), moments,
                                 model.expert_shards()->whole_table, {});
    if (!saved.ok()) return saved.error();
  }
  TROUPE_TRY(world.barrier());
  return latest_checkpoint(dir);
}

}  // namespace troupe::learner::test
