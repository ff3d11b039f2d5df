// Sharded checkpoints under mpirun (learner.shard): each rank writes its shard in parallel; resumed
// at the same rank count and stage it continues bit for bit; resumed at half the ranks, one rank or
// another stage it loads exactly the gathered parameters and AdamW moments and steps as a run
// continued from that gathered state does; written by half the ranks and resumed by all, it steps as
// the uninterrupted run. Corrupt and missing shards name the file and rank, a checkpoint of another
// model names the tensor, a rank that cannot write leaves nothing committed. Pieced (divided experts:
// several uneven pieces per rank) it reads back as the whole state. Exits non-zero on any
// rank's failure (rank 0 prints each check).
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "random_samples.h"
#include "troupe/base/enum_names.h"
#include "troupe/learner/lora_checkpoint.h"
#include "troupe/learner/sharded_checkpoint.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/peft_adapter.h"
#include "troupe/policy/io/sharded_weights.h"
#include "troupe/policy/model.h"

using namespace troupe;
using namespace troupe::learner;
namespace fs = std::filesystem;

namespace {

constexpr int V = 32;

LearnerConfig config(ShardStage stage) {
  LearnerConfig l;
  l.max_completion_length = 7;
  l.optimizer.lr = 1e-2f;
  l.optimizer.weight_decay = 0.01f;
  l.optimizer.max_grad_norm = 0.05f;  // clipping active
  l.loss.kl_coef = 0.04f;
  l.batch.num_mini_batches = 2;
  l.batch.micro_batch_size = 2;
  l.batch.shuffle = true;
  l.seed = 5;
  l.shard = stage;
  return l;
}

policy::ModelConfig tiny(int lora_rank, int hidden = 16) {
  policy::ModelConfig mc;
  mc.vocab_size = V;
  mc.hidden_size = hidden;
  mc.num_hidden_layers = 2;
  mc.num_attention_heads = 2;
  mc.num_key_value_heads = 1;
  mc.head_dim = 8;
  mc.intermediate_size = 32;
  mc.lora.rank = lora_rank;
  using T = policy::LoraTarget;
  if (lora_rank > 0) mc.lora.targets = {T::q, T::v, T::o};
  return mc;
}

// A model and its Trainer on one communicator.
struct Learner {
  std::unique_ptr<policy::Model> model;
  std::unique_ptr<ModelAdapter> adapter;
  std::unique_ptr<Trainer> trainer;
};

Learner make_learner(const policy::ModelConfig& mc, ShardStage stage, Communicator& comm) {
  Learner l;
  auto m = policy::Model::create(mc, 11);
  if (!m.ok()) {
    std::fprintf(stderr, "model: %s\n", m.error().message.c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  l.model = std::make_unique<policy::Model>(std::move(m.value()));
  l.adapter = std::make_unique<ModelAdapter>(*l.model);
  l.trainer = std::make_unique<Trainer>(*l.adapter, config(stage), comm);
  l.trainer->set_params_between_steps(ParamsAtRest::rank0);  // as troupe run's learners
  return l;
}

// The whole state, gathered: what every layout must load.
struct Whole {
  std::vector<float> params, m, v;
  int64_t steps = 0;
  nlohmann::json trainer;
};

Result<Whole> gather(Learner& l) {
  TROUPE_TRY(l.trainer->gather_params());
  TROUPE_ASSIGN_OR_RETURN(AdamW o, l.trainer->gathered_optimizer());
  Whole w;
  w.params.assign(l.model->params().begin(), l.model->params().end());
  w.m.assign(o.exp_avg().begin(), o.exp_avg().end());
  w.v.assign(o.exp_avg_sq().begin(), o.exp_avg_sq().end());
  w.steps = o.steps();
  w.trainer = l.trainer->state_json();
  return w;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool same_state(const Whole& a, const Whole& b) {
  return same_bits(a.params, b.params) && same_bits(a.m, b.m) && same_bits(a.v, b.v) && a.steps == b.steps;
}

// One step's numbers and the weights after it.
struct Trace {
  double loss = 0, norm = 0;
  std::vector<float> params;
};

Result<Trace> step(Learner& l) {
  TROUPE_ASSIGN_OR_RETURN(auto r, l.trainer->train_step(test::make_batch(41, 16, V)));
  TROUPE_TRY(l.trainer->gather_params());
  return Trace{r.loss.loss, r.grad_norm, {l.model->params().begin(), l.model->params().end()}};
}
bool same_trace(const Trace& a, const Trace& b) { return a.loss == b.loss && a.norm == b.norm && same_bits(a.params, b.params); }

Result<std::string> save(Learner& l, const std::string& root, Communicator& comm, ShardStage stage, int64_t at) {
  const auto& model = *l.model;
  ModelDirWriter meta = [&](const std::string& dir) -> Status {
    if (model.lora_enabled()) return write_lora_adapter_files(dir, model, "", false);
    return policy::io::save_model_dir_meta(dir, model.config(), nullptr);
  };
  CheckpointData d;
  d.step = at;
  d.policy_version = at;
  d.trainer_state = l.trainer->state_json();
  const auto& o = std::as_const(*l.trainer).optimizer();
  const auto bounds = shard_bounds(model.params().size(), comm.size());
  const size_t lo = l.trainer->shard_begin(), n = l.trainer->shard_end() - lo;
  RankShard s{model.params().subspan(lo, n), o.exp_avg(), o.exp_avg_sq(), bounds, &model.tensors(),
              model.lora_enabled() ? "lora_adapter" : "model", std::string(enum_string(stage)), o.steps()};
  return save_sharded_checkpoint(root, d, meta, s, comm, {});
}

// A fresh learner resumed from step_dir as troupe run's learners do; `loaded`: the state it took.
Result<Learner> resume(const policy::ModelConfig& mc, const std::string& step_dir, ShardStage stage, Communicator& comm,
                       Whole& loaded) {
  Learner l = make_learner(mc, stage, comm);
  AdamW whole(l.model->params().size());
  TROUPE_ASSIGN_OR_RETURN(auto d, load_checkpoint(step_dir, l.model->tensors(), whole));
  if (l.model->lora_enabled()) {
    TROUPE_TRY(read_lora_adapter_files(step_dir, *l.model));
  } else {
    std::vector<float> p(l.model->params().size());
    TROUPE_TRY(read_sharded_params(step_dir, l.model->tensors(), p));
    TROUPE_TRY(l.model->set_params(p));
  }
  loaded.params.assign(l.model->params().begin(), l.model->params().end());
  loaded.m.assign(whole.exp_avg().begin(), whole.exp_avg().end());
  loaded.v.assign(whole.exp_avg_sq().begin(), whole.exp_avg_sq().end());
  loaded.steps = whole.steps();
  TROUPE_TRY(l.trainer->load_optimizer(std::move(whole)));
  TROUPE_TRY(l.trainer->load_state_json(d.trainer_state));
  return l;
}

// A fresh learner continued from the gathered state in memory (no file): the comparison run.
Result<Learner> from_whole(const policy::ModelConfig& mc, const Whole& w, ShardStage stage, Communicator& comm) {
  Learner l = make_learner(mc, stage, comm);
  TROUPE_TRY(l.model->set_params(w.params));
  AdamW o(w.params.size());
  std::copy(w.m.begin(), w.m.end(), o.exp_avg().begin());
  std::copy(w.v.begin(), w.v.end(), o.exp_avg_sq().begin());
  o.set_steps(w.steps);
  TROUPE_TRY(l.trainer->load_optimizer(std::move(o)));
  TROUPE_TRY(l.trainer->load_state_json(w.trainer));
  return l;
}

struct Checker {
  Communicator& world;
  int bad = 0;
  // true when `ok` holds on every rank
  bool operator()(bool ok, const std::string& what) {
    int mine = ok, all = ok;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (world.rank() == 0) std::printf("%s: %s\n", what.c_str(), all ? "ok" : "FAILED");
    bad |= !all;
    return all != 0;
  }
  template <class T>
  bool ok_or_print(const Result<T>& r) {
    if (!r.ok()) std::fprintf(stderr, "rank %d: %s\n", world.rank(), r.error().message.c_str());
    return r.ok();
  }
  bool ok_or_print(const Status& r) {
    if (!r.ok()) std::fprintf(stderr, "rank %d: %s\n", world.rank(), r.error().message.c_str());
    return r.ok();
  }
};

bool has(const Status& s, std::initializer_list<const char*> parts) {
  if (s.ok()) return false;
  for (const char* p : parts)
    if (s.error().message.find(p) == std::string::npos) {
      std::fprintf(stderr, "error lacks '%s': %s\n", p, s.error().message.c_str());
      return false;
    }
  return true;
}
template <class T>
Status status_of(const Result<T>& r) {
  return r.ok() ? Status{} : Status(r.error());
}

// Resumed at `comm` as `stage`: loads exactly `ref`, then steps as a run continued from `ref` in
// memory at the same layout (and, where want is given, as that trace).
void check_resume(Checker& check, const policy::ModelConfig& mc, const std::string& step_dir, const Whole& ref,
                  ShardStage stage, Communicator& comm, const std::string& what, const Trace* want = nullptr) {
  Whole loaded;
  auto l = resume(mc, step_dir, stage, comm, loaded);
  const bool ok = check.ok_or_print(l);
  if (!check(ok && same_state(loaded, ref), what + ": loads the gathered parameters and moments bit for bit") || !ok) return;
  auto a = step(*l);
  auto base = from_whole(mc, ref, stage, comm);
  Result<Trace> b = base.ok() ? step(*base) : Result<Trace>(base.error());
  bool same = check.ok_or_print(a) && check.ok_or_print(b) && same_trace(*a, *b);
  if (want) same = same && a.ok() && same_trace(*a, *want);
  check(same, what + (want ? ": the next step equals the uninterrupted run bit for bit"
                           : ": the next step equals the run continued from the gathered state bit for bit"));
}

void check_bad_input(Checker& check, const std::string& root, const std::string& step_dir, const policy::ModelConfig& mc,
                     Communicator& world) {
  const int W = world.size(), last = W - 1;
  const std::string bad = root + "/bad", gone = root + "/gone";
  if (world.rank() == 0) {
    fs::copy(step_dir, bad, fs::copy_options::recursive);
    fs::copy(step_dir, gone, fs::copy_options::recursive);
    const std::string f = bad + "/shards/rank_" + std::to_string(last) + ".safetensors";
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(-3, std::ios::end);
    io.put('\x7f');
    fs::remove(gone + "/shards/rank_1.safetensors");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string of = " of " + std::to_string(W) + ")";
  const std::string rank_last = "(rank " + std::to_string(last) + of, rank_1 = "(rank 1" + of;
  const std::string file_last = "rank_" + std::to_string(last) + ".safetensors";
  const Status read_bad = mc.lora.rank == 0 ? status_of(policy::io::load_model(bad)) : status_of(policy::io::read_peft_adapter(bad));
  check(has(status_of(verify_checkpoint(bad)), {file_last.c_str(), rank_last.c_str(), "checksum"}) &&
            has(read_bad, {rank_last.c_str(), "checksum"}),
        std::string("a corrupt shard is named with its rank (verify_checkpoint, ") +
            (mc.lora.rank == 0 ? "load_model)" : "read_peft_adapter)"));
  check(has(status_of(verify_checkpoint(gone)), {"rank_1.safetensors", rank_1.c_str(), "missing"}),
        "a missing shard is named with its rank");
  // another model: hidden size 24 instead of 16 (the table's shapes and offsets differ)
  Whole loaded;
  auto other = resume(tiny(mc.lora.rank, 24), step_dir, ShardStage::none, world, loaded);
  check(has(status_of(other), {"shards.json", "another model", "but the model has"}),
        "a checkpoint of another model names the tensor that differs");
  if (world.rank() == 0 && !other.ok()) std::printf("  (%s)\n", other.error().message.c_str());
}

// A rank that cannot write its shard: every rank gets an error, and nothing is committed.
void check_failed_rank(Checker& check, Learner& l, const std::string& root, Communicator& world) {
  const auto before = latest_checkpoint(root);
  const auto& model = *l.model;
  const auto& o = std::as_const(*l.trainer).optimizer();
  const auto bounds = shard_bounds(model.params().size(), world.size());
  const size_t lo = l.trainer->shard_begin(), n = l.trainer->shard_end() - lo;
  // rank 1 hands a slice one value short: its file is refused
  const size_t take = world.rank() == 1 ? n - 1 : n;
  RankShard s{model.params().subspan(lo, take), o.exp_avg(), o.exp_avg_sq(), bounds, &model.tensors(), "model", "x", 0};
  CheckpointData d;
  d.step = 99;
  auto r = save_sharded_checkpoint(root, d, [](const std::string&) { return Status{}; }, s, world, {});
  const auto after = latest_checkpoint(root);
  check(!r.ok() && !fs::exists(root + "/step_99") && before.ok() && after.ok() && *before == *after,
        "a rank that cannot write its shard: an error on every rank, nothing committed, latest unchanged");
  if (world.rank() == 0 && !r.ok()) std::printf("  (%s)\n", r.error().message.c_str());
}

// Pieced (divided experts' layout): the files are pieces of bounds of their own, several per rank
// (piece i written by rank i % ranks, from the whole state `w`); the readers take it as any sharded
// checkpoint (the same weights and moments), and a piece nobody writes is named, nothing committed.
void check_pieced(Checker& check, const policy::ModelConfig& mc, const Whole& w, const std::string& root,
                  Communicator& world) {
  if (mc.lora.rank > 0) return;  // (the layout is for whole models)
  const size_t N = w.params.size(), pieces = 3 * static_cast<size_t>(world.size()) + 1;
  std::vector<size_t> bounds{0};
  for (size_t i = 1; i < pieces; ++i) bounds.push_back(N * i * i / (pieces * pieces));  // (uneven)
  bounds.push_back(N);
  auto model = policy::Model::create(mc, 11);
  if (!check(model.ok(), "pieced: the model")) return;
  const auto& table = model->tensors();
  auto write = [&](const std::string& dir, int64_t at, bool skip_last) {
    RankShard s{{}, {}, {}, bounds, &table, "model", "none", w.steps};
    s.pieced = true;
    s.layout = "expert_runs " + std::to_string(world.size());
    for (size_t i = static_cast<size_t>(world.rank()); i < pieces; i += static_cast<size_t>(world.size())) {
      if (skip_last && i + 1 == pieces) continue;
      const size_t lo = bounds[i], n = bounds[i + 1] - lo;
      s.pieces.push_back({i, std::span<const float>(w.params).subspan(lo, n), std::span<const float>(w.m).subspan(lo, n),
                          std::span<const float>(w.v).subspan(lo, n)});
    }
    CheckpointData d;
    d.step = at;
    return save_sharded_checkpoint(dir, d, [&](const std::string& m) { return policy::io::save_model_dir_meta(m, mc, nullptr); },
                                   s, world, {});
  };
  auto saved = write(root + "/pieced", 1, false);
  MPI_Barrier(MPI_COMM_WORLD);  // (learner 0 commits the step after the others return)
  bool same = check.ok_or_print(saved) && verify_checkpoint(*saved).ok();
  if (same) {
    auto m = policy::io::load_model(*saved);
    AdamW o(N);
    auto d = load_checkpoint(*saved, table, o);
    same = check.ok_or_print(m) && check.ok_or_print(d) && same_bits({m->model.params().begin(), m->model.params().end()}, w.params) &&
           same_bits({o.exp_avg().begin(), o.exp_avg().end()}, w.m) && same_bits({o.exp_avg_sq().begin(), o.exp_avg_sq().end()}, w.v);
    auto manifest = policy::io::read_shard_manifest(*saved);
    same = same && manifest.ok() && manifest->layout == "expert_runs " + std::to_string(world.size()) &&
           manifest->world_size == static_cast<int>(pieces);
  }
  check(same, "pieced: " + std::to_string(pieces) + " pieces, several per rank, read back as the whole state");
  auto missing = write(root + "/pieced", 2, true);
  check(!missing.ok() && !fs::exists(root + "/pieced/step_2") &&
            missing.error().message.find("the files of piece(s) " + std::to_string(pieces - 1)) != std::string::npos,
        "pieced: a piece nobody writes is named, nothing committed");
  if (world.rank() == 0 && !missing.ok()) std::printf("  (%s)\n", missing.error().message.c_str());
}

int run_model(const char* name, const policy::ModelConfig& mc, Communicator& world, Communicator& half,
              const std::string& root) {
  Checker check{world};
  const auto P = ShardStage::parameters;
  const std::string W = std::to_string(world.size()), H = std::to_string(half.size());
  if (world.rank() == 0) std::printf("== %s, %s ranks (halves of %s) ==\n", name, W.c_str(), H.c_str());
  // the uninterrupted run: ZeRO-3 on every rank, one step, saved, one more step
  Learner a = make_learner(mc, P, world);
  check(check.ok_or_print(a.trainer->train_step(test::make_batch(40, 16, V))), "first step");
  auto ref = gather(a);
  auto saved = save(a, root + "/w", world, P, 1);
  check(check.ok_or_print(ref) && check.ok_or_print(saved), "every rank writes its shard (" + W + " files)");
  if (!ref.ok() || !saved.ok()) return 1;
  const std::string step_dir = *saved;
  bool files = fs::exists(step_dir + "/shards.json") && !fs::exists(step_dir + "/optimizer.safetensors");
  for (int r = 0; r < world.size(); ++r) files = files && fs::exists(step_dir + "/shards/rank_" + std::to_string(r) + ".safetensors");
  check(files && verify_checkpoint(step_dir).ok(), "the step directory holds shards.json and one file per rank, verified");
  auto straight = step(a);
  check(check.ok_or_print(straight), "second step");
  if (!straight.ok()) return 1;

  check_resume(check, mc, step_dir, *ref, P, world, "same ranks, same stage", &*straight);
  check_resume(check, mc, step_dir, *ref, ShardStage::none, world, "same ranks as shard none", &*straight);
  check_resume(check, mc, step_dir, *ref, ShardStage::optimizer, half, H + " ranks as shard optimizer");
  check_resume(check, mc, step_dir, *ref, ShardStage::none, half, H + " ranks as shard none");
  LocalCommunicator one;
  check_resume(check, mc, step_dir, *ref, ShardStage::none, one, "1 rank");

  // the reverse: the same state written by half the ranks (ZeRO-1), resumed by all as ZeRO-3
  auto h = from_whole(mc, *ref, ShardStage::optimizer, half);
  const int group = world.rank() / half.size();
  auto hsaved = h.ok() ? save(*h, root + "/h" + std::to_string(group), half, ShardStage::optimizer, 1)
                       : Result<std::string>(h.error());
  check(check.ok_or_print(hsaved), H + " ranks write the gathered state in " + H + " shards");
  if (hsaved.ok()) check_resume(check, mc, root + "/h0/step_1", *ref, P, world, "written by " + H + ", resumed by " + W + " as shard parameters", &*straight);

  // the readers: load_model (a whole model's shards) and read_peft_adapter (a LoRA run's)
  if (mc.lora.rank == 0) {
    auto m = policy::io::load_model(step_dir);
    check(check.ok_or_print(m) && same_bits({m->model.params().begin(), m->model.params().end()}, ref->params),
          "policy::io::load_model reads the sharded checkpoint (the gathered weights)");
  } else {
    auto ad = policy::io::read_peft_adapter(step_dir);
    bool same = check.ok_or_print(ad) && ad->tensors.size() == a.model->tensors().size();
    for (const auto& s : a.model->tensors())
      same = same && ad->tensors.count(s.name) &&
             same_bits(ad->tensors.at(s.name).data, {ref->params.begin() + static_cast<std::ptrdiff_t>(s.offset),
                                                     ref->params.begin() + static_cast<std::ptrdiff_t>(s.offset + s.numel())});
    check(same, "policy::io::read_peft_adapter reads the sharded LoRA checkpoint (the gathered adapters)");
  }
  check_bad_input(check, root, step_dir, mc, world);
  check_failed_rank(check, a, root + "/w", world);
  check_pieced(check, mc, *ref, root, world);
  return check.bad;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm half_comm;
    const int half_size = size >= 2 ? size / 2 : 1;
    MPI_Comm_split(MPI_COMM_WORLD, rank / half_size, rank, &half_comm);
    auto world = make_mpi_communicator();
    auto half = make_mpi_communicator(&half_comm);
    if (!world.ok() || !half.ok()) {
      std::fprintf(stderr, "communicator: %s\n", (!world.ok() ? world.error() : half.error()).message.c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    // a directory every rank sees: rank 0's, made fresh (argv[1]: this one, kept for
    // learner.shard_checkpoint_consolidate; else a temporary one, removed after a pass)
    const bool keep = argc > 1;
    char dir[256] = {};
    if (rank == 0) {
      const fs::path base = keep ? fs::path(argv[1]) : fs::temp_directory_path() / ("troupe_shard_ckpt_" + std::to_string(::getpid()));
      fs::remove_all(base);
      fs::create_directories(base);
      std::snprintf(dir, sizeof dir, "%s", base.c_str());
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    bad |= run_model("tiny dense policy::Model", tiny(0), **world, **half, std::string(dir) + "/dense");
    bad |= run_model("tiny policy::Model with LoRA r=2", tiny(2), **world, **half, std::string(dir) + "/lora");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0 && !bad && !keep) fs::remove_all(dir);
    MPI_Comm_free(&half_comm);
  }
  MPI_Finalize();
  return bad;
}
