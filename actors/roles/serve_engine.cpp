// The serving engine: one compute thread that admits queued requests into free decode slots
// between steps and samples one token for every running sequence per step (serve_engine.h).
#include "troupe/actors/serve_engine.h"

#include <algorithm>
#include <map>

#include "role_support.h"

namespace troupe::actors {

bool ServeStream::next(policy::SlotToken* token) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !tokens_.empty() || finish_ != ServeFinish::running; });
  if (tokens_.empty()) return false;
  *token = std::move(tokens_.front());
  tokens_.pop_front();
  return true;
}

void ServeStream::cancel() {
  std::lock_guard lk(mu_);
  cancelled_ = true;
}

ServeFinish ServeStream::finish() const {
  std::lock_guard lk(mu_);
  return finish_;
}

std::string ServeStream::error() const {
  std::lock_guard lk(mu_);
  return error_;
}

int64_t ServeStream::policy_version() const {
  std::lock_guard lk(mu_);
  return version_;
}

void ServeStream::wake_per_token(bool on) {
  std::lock_guard lk(mu_);
  wake_per_token_ = on;
}

void ServeStream::push(policy::SlotToken t) {
  bool wake;
  {
    std::lock_guard lk(mu_);
    tokens_.push_back(std::move(t));
    wake = wake_per_token_;
  }
  if (wake) cv_.notify_all();
}

void ServeStream::end(ServeFinish why, std::string error) {
  std::function<void(ServeStream&)> on_end;
  {
    std::lock_guard lk(mu_);
    if (finish_ != ServeFinish::running) return;
    finish_ = why;
    error_ = std::move(error);
    on_end.swap(on_end_);
  }
  cv_.notify_all();
  if (on_end) on_end(*this);
}

Result<std::unique_ptr<ServeEngine>> ServeEngine::create(std::unique_ptr<policy::Model> model,
                                                         const ServeEngineOptions& options) {
  if (!model) return invalid_input("serve engine: no model");
  std::unique_ptr<ServeEngine> e(new ServeEngine());
  e->options_ = options;
  e->vocab_ = model->config().vocab_size;
  TROUPE_ASSIGN_OR_RETURN(e->slots_,
                          policy::DecodeSlots::create(*model, options.slots, options.context, options.prefill_tokens));
  e->model_ = std::move(model);
  e->thread_ = std::thread([p = e.get()] { p->loop(); });
  return e;
}

ServeEngine::~ServeEngine() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  applied_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& j : queue_) j.stream->end(ServeFinish::cancelled);
}

std::shared_ptr<ServeStream> ServeEngine::submit(ServeRequest request) {
  auto stream = std::make_shared<ServeStream>();
  stream->on_end_ = std::move(request.on_end);
  {
    std::lock_guard lk(mu_);
    if (stop_) {
      stream->end(ServeFinish::cancelled);
      return stream;
    }
    queue_.push_back(Job{std::move(request), stream, 0});
  }
  cv_.notify_all();
  return stream;
}

Status ServeEngine::set_weights(int64_t version, const std::vector<float>& params) {
  std::unique_lock lk(mu_);
  applied_cv_.wait(lk, [&] { return stop_ || pending_params_ == nullptr; });  // one update at a time
  if (stop_) return make_error(ErrorCode::internal, "serve engine: stopped before the weights were applied");
  pending_params_ = &params;
  pending_version_ = version;
  const uint64_t ticket = applied_ + 1;
  cv_.notify_all();
  applied_cv_.wait(lk, [&] { return stop_ || applied_ >= ticket; });
  if (applied_ < ticket) {
    pending_params_ = nullptr;
    return make_error(ErrorCode::internal, "serve engine: stopped before the weights were applied");
  }
  return pending_status_;
}

int64_t ServeEngine::version() const {
  std::lock_guard lk(mu_);
  return version_;
}

Status ServeEngine::run_with_model(const std::function<Status(policy::Model&)>& task) {
  Task t;
  t.fn = &task;
  std::unique_lock lk(mu_);
  if (!stop_) {
    tasks_.push_back(&t);
    cv_.notify_all();
    applied_cv_.wait(lk, [&] { return stop_ || t.done; });
  }
  if (t.done) return t.status;
  tasks_.erase(std::remove(tasks_.begin(), tasks_.end(), &t), tasks_.end());
  return make_error(ErrorCode::internal, "serve engine: stopped before the task ran");
}

// The run_with_model tasks queued now, in order, outside the lock (the compute thread owns the model).
void ServeEngine::run_tasks() {
  std::deque<Task*> tasks;
  {
    std::lock_guard lk(mu_);
    tasks.swap(tasks_);
  }
  if (tasks.empty()) return;
  for (Task* t : tasks) t->status = (*t->fn)(*model_);
  {
    std::lock_guard lk(mu_);
    for (Task* t : tasks) t->done = true;
  }
  applied_cv_.notify_all();
}

uint64_t ServeEngine::steps() const {
  std::lock_guard lk(mu_);
  return steps_;
}

int ServeEngine::peak_batch() const {
  std::lock_guard lk(mu_);
  return peak_batch_;
}

void ServeEngine::loop() {
  use_threads(options_.threads);
  std::map<int, Job> running;  // by slot
  auto is_cancelled = [](const ServeStream& s) {
    std::lock_guard lk(s.mu_);
    return s.cancelled_;
  };
  for (;;) {
    {  // admit waiting requests into free slots (they join at this step)
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] {
        return stop_ || !queue_.empty() || !running.empty() || pending_params_ != nullptr || !tasks_.empty();
      });
      if (stop_) break;
      if (pending_params_ != nullptr && running.empty()) {  // new weights: nothing runs on the old ones
        pending_status_ = model_->set_params(*pending_params_);
        if (pending_status_.ok()) version_ = pending_version_;
        pending_params_ = nullptr;
        ++applied_;
        applied_cv_.notify_all();
      }
      while (pending_params_ == nullptr && !queue_.empty() && slots_->free_slots() > 0) {
        Job j = std::move(queue_.front());
        queue_.pop_front();
        if (j.request.max_tokens <= 0) {
          j.stream->end(ServeFinish::length);
          continue;
        }
        auto slot = slots_->add(j.request.prompt, j.request.sampling);
        if (!slot.ok()) {
          j.stream->end(ServeFinish::error, slot.error().message);
          continue;
        }
        {
          std::lock_guard sl(j.stream->mu_);
          j.stream->version_ = version_;
        }
        running.emplace(*slot, std::move(j));
      }
    }
    run_tasks();
    for (auto it = running.begin(); it != running.end();) {  // drop the requests cancelled meanwhile
      if (is_cancelled(*it->second.stream)) {
        slots_->remove(it->first);
        it->second.stream->end(ServeFinish::cancelled);
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    if (running.empty()) continue;
    auto tokens = slots_->step();
    if (!tokens.ok()) {  // the model failed: every running request ends with the reason
      for (auto& [slot, j] : running) {
        slots_->remove(slot);
        j.stream->end(ServeFinish::error, tokens.error().message);
      }
      running.clear();
      continue;
    }
    {
      std::lock_guard lk(mu_);
      ++steps_;
      peak_batch_ = std::max(peak_batch_, static_cast<int>(tokens->size()));
    }
    for (auto& t : *tokens) {
      auto it = running.find(t.slot);
      if (it == running.end()) continue;
      Job& j = it->second;
      const int32_t id = t.token;
      j.stream->push(std::move(t));
      ++j.produced;
      ServeFinish why = ServeFinish::running;
      const auto& stops = j.request.stop_tokens;
      if (std::find(stops.begin(), stops.end(), id) != stops.end()) why = ServeFinish::stop;
      else if (j.produced >= j.request.max_tokens || slots_->room(it->first) <= 0) why = ServeFinish::length;
      if (why != ServeFinish::running) {
        slots_->remove(it->first);
        j.stream->end(why);
        running.erase(it);
      }
    }
  }
  for (auto& [slot, j] : running) j.stream->end(ServeFinish::cancelled);
}

}  // namespace troupe::actors
