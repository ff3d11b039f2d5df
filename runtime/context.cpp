// Context: the non-template members of the handle an actor's code gets (see system.h).
#include <algorithm>

#include "src/actor_cell.h"
#include "troupe/runtime/system.h"

namespace troupe::runtime {

Clock::time_point Context::now() const { return sys_->now(); }

ReplyTo Context::reply_later() const {
  if (!mail_ || !(mail_->header.flags & kFlagRequest)) return {};
  return ReplyTo{sys_, self_, mail_->header.sender, mail_->header.correlation};
}

Status Context::reply_error(const Error& e) { return reply_later().send_error(e); }

Status ReplyTo::send_error(const Error& e) const {
  if (!sys) return make_error(ErrorCode::internal, "reply_error outside a request handler");
  return send(ErrorReply{static_cast<std::int32_t>(e.code), e.message});
}

TimerId Context::after(Duration delay, std::function<void(Context&)> fn) {
  TimerId id = sys_->start_timer(self_, delay, Duration{0}, std::move(fn));
  cell_->timers.push_back(id);
  return id;
}
TimerId Context::every(Duration period, std::function<void(Context&)> fn) {
  TimerId id = sys_->start_timer(self_, period, period, std::move(fn));
  cell_->timers.push_back(id);
  return id;
}
void Context::cancel(TimerId id) {
  sys_->cancel_timer(id);
  auto& ts = cell_->timers;
  ts.erase(std::remove(ts.begin(), ts.end(), id), ts.end());
}
void Context::watch_node(std::uint32_t node) { sys_->watch_node_for(self_, node); }
void Context::monitor(ActorId a) { sys_->monitor_for(self_, a); }
void Context::fail(Error e) { sys_->mark_failed(cell_, std::move(e)); }
void Context::stop() { sys_->mark_stop(cell_); }

}  // namespace troupe::runtime
