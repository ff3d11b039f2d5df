// RequestTable: pending requests, their timeouts and their one completion (see request_table.h).
#include "request_table.h"

#include <vector>

namespace troupe::runtime {

std::uint64_t RequestTable::begin(ActorId owner, ActorId to, Duration timeout, RawReply on_reply) {
  std::uint64_t corr = next_correlation_.fetch_add(1);
  {
    std::lock_guard lock(mu_);
    pending_[corr] = Pending{owner, to.node, std::move(on_reply), 0};
  }
  TimerId t = timers_.add(timers_.now() + timeout, Duration{0}, [this, corr, to, timeout] {
    complete(corr,
             make_error(ErrorCode::timeout, "runtime: request " + std::to_string(corr) + " to " +
                                                to_string(to) + " timed out after " + ms_text(timeout)));
  });
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(corr);
    if (it != pending_.end()) it->second.timer = t;
  }
  return corr;
}

void RequestTable::complete(std::uint64_t corr, Outcome r, ActorCell** runnable) {
  Pending p;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(corr);
    if (it == pending_.end()) return;  // late reply after a timeout: dropped
    p = std::move(it->second);
    pending_.erase(it);
  }
  if (p.timer) timers_.remove(p.timer);
  answer(p.owner, std::move(p.on_reply), std::move(r), runnable);
}

void RequestTable::answer(ActorId owner, RawReply on_reply, Outcome r, ActorCell** runnable) {
  if (owner.local == 0) {
    on_reply(nullptr, std::move(r));
    return;
  }
  ActorCell* c = actors_.find(owner.local);
  if (!c) return;
  auto shared = std::make_shared<Outcome>(std::move(r));
  auto cb = std::make_shared<RawReply>(std::move(on_reply));
  auto task = [shared, cb](Context& ctx) { (*cb)(&ctx, std::move(*shared)); };
  if (!runnable)
    scheduler_.post(c, std::move(task));
  else if (scheduler_.post_task(c, std::move(task)))
    *runnable = c;
}

void RequestTable::fail_node(std::uint32_t node, const Error& e) {
  std::vector<std::uint64_t> doomed;
  {
    std::lock_guard lock(mu_);
    for (auto& [corr, pend] : pending_)
      if (pend.target_node == node) doomed.push_back(corr);
  }
  for (auto corr : doomed) complete(corr, e);
}

void RequestTable::abandon_all(const Error& e) {
  std::vector<std::uint64_t> all;
  {
    std::lock_guard lock(mu_);
    for (auto& [corr, p] : pending_) all.push_back(corr);
  }
  for (auto corr : all) {
    Pending p;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(corr);
      if (it == pending_.end()) continue;
      p = std::move(it->second);
      pending_.erase(it);
    }
    if (p.owner.local == 0) p.on_reply(nullptr, e);
  }
}

}  // namespace troupe::runtime
