// The process-wide caller of a local model (local_model.h). Invariant: it is swapped and read
// under one mutex, and a call runs on a copy, so installing a new caller never races a call.
#include "troupe/envs/local_model.h"

#include <mutex>

namespace troupe::envs {

namespace {
std::mutex& caller_mutex() {
  static std::mutex m;
  return m;
}
LocalModelCaller& caller_slot() {
  static LocalModelCaller c;
  return c;
}
}  // namespace

void set_local_model_caller(LocalModelCaller caller) {
  std::lock_guard lk(caller_mutex());
  caller_slot() = std::move(caller);
}

Result<std::string> call_local_model(const LocalModelRequest& r) {
  LocalModelCaller c;
  {
    std::lock_guard lk(caller_mutex());
    c = caller_slot();
  }
  if (!c)
    return invalid_input("local model " + r.model +
                         ": no scorer is reachable from this process (a judge with model: needs cluster.scorers >= 1 "
                         "and the env in troupe's own process, not isolate: true)");
  return c(r);
}

}  // namespace troupe::envs
