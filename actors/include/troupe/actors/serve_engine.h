// The serving engine (actors/serve_engine.cpp): continuous batching of concurrent sampling
// requests over one policy model. Callers on any thread submit() a request and read its tokens
// from the returned stream; one compute thread owns the model and a policy::DecodeSlots, admits
// waiting requests into free slots between decode steps and steps every running sequence together.
// Used by `troupe serve` (launch/serve/openai_server.cpp) behind the OpenAI-compatible HTTP endpoint.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/policy/decode_slots.h"
#include "troupe/policy/model.h"

namespace troupe::actors {

struct ServeRequest {
  std::vector<int32_t> prompt;
  policy::SlotSampling sampling;
  int max_tokens = 16;               // the sequence ends after this many new tokens ("length")
  std::vector<int32_t> stop_tokens;  // a sampled stop token ends it ("stop"); it is part of the output
  // Called once when the request ends, however it ends (after its last token is pushed, on the
  // thread that ended it: the compute thread, or submit/the destructor for a request never run);
  // next() then returns the tokens without waiting. Empty: none.
  std::function<void(class ServeStream&)> on_end;
};

enum class ServeFinish { running, stop, length, cancelled, error };

// The tokens of one request, filled by the compute thread as they are sampled.
class ServeStream {
 public:
  // Waits until a token is there or the request ended; false once every token has been read and
  // the request is over (finish() then says why).
  bool next(policy::SlotToken* token);
  // Ends the request at the next step (e.g. a stop string matched or the client left).
  void cancel();
  // false: a reader that only wants the whole completion is woken when the request ends, not for
  // every token (next() still returns each token; one wake-up per request instead of one per step).
  void wake_per_token(bool on);
  ServeFinish finish() const;
  std::string error() const;  // finish() == error: why
  // The policy version whose weights sampled every token of this request (set when it is admitted;
  // weights change only while no request runs, see ServeEngine::set_weights).
  int64_t policy_version() const;

 private:
  friend class ServeEngine;
  void push(policy::SlotToken t);
  void end(ServeFinish why, std::string error = {});
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void(ServeStream&)> on_end_;
  std::deque<policy::SlotToken> tokens_;
  ServeFinish finish_ = ServeFinish::running;
  std::string error_;
  bool cancelled_ = false;
  bool wake_per_token_ = true;
  int64_t version_ = 0;
};

struct ServeEngineOptions {
  int slots = 16;              // sequences stepped together at most
  int context = 2048;          // tokens (prompt + completion) per sequence
  int prefill_tokens = 4096;   // prompt tokens prefilled per step at most
  int threads = 0;             // OpenMP threads of the compute thread (0 = the process default)
};

class ServeEngine {
 public:
  // The engine owns `model` from here on (only its compute thread touches it).
  static Result<std::unique_ptr<ServeEngine>> create(std::unique_ptr<policy::Model> model,
                                                     const ServeEngineOptions& options);
  ~ServeEngine();  // ends every request (cancelled) and joins the compute thread

  // Queues a request (thread-safe). A request the slots refuse (prompt too long for the context,
  // token outside the vocabulary) ends with finish() == error.
  std::shared_ptr<ServeStream> submit(ServeRequest request);

  // Replaces the model's parameters (a run's weight sync) and tags the requests admitted from then
  // on with `version`. Applied between steps once no sequence is running: requests in flight end on
  // the weights they started with, queued ones wait. Blocks until applied (or the engine stops).
  Status set_weights(int64_t version, const std::vector<float>& params);
  int64_t version() const;

  // Runs `task` with the model on the compute thread between two decode steps (work that is no
  // decode step, e.g. a scorer's packed log-prob forward; running sequences go on at the next
  // step) and returns its status; blocks until it ran (an error if the engine stops first).
  Status run_with_model(const std::function<Status(policy::Model&)>& task);

  int context() const { return options_.context; }
  int slots() const { return options_.slots; }
  int vocab_size() const { return vocab_; }
  // Observability: steps run and the most sequences one step sampled for.
  uint64_t steps() const;
  int peak_batch() const;

 private:
  ServeEngine() = default;
  void loop();
  void run_tasks();
  struct Task {
    const std::function<Status(policy::Model&)>* fn = nullptr;
    Status status;
    bool done = false;
  };
  struct Job {
    ServeRequest request;
    std::shared_ptr<ServeStream> stream;
    int produced = 0;
  };
  ServeEngineOptions options_;
  int vocab_ = 0;
  std::unique_ptr<policy::Model> model_;
  std::unique_ptr<policy::DecodeSlots> slots_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::deque<Task*> tasks_;  // run_with_model calls waiting for the compute thread
  bool stop_ = false;
  const std::vector<float>* pending_params_ = nullptr;  // set_weights waiting to be applied
  int64_t pending_version_ = 0;
  Status pending_status_;
  uint64_t applied_ = 0;  // weight updates applied so far
  int64_t version_ = 0;
  std::condition_variable applied_cv_;
  uint64_t steps_ = 0;
  int peak_batch_ = 0;
  std::thread thread_;
};

}  // namespace troupe::actors
