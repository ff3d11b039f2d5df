// Members joining and leaving the running job (troupe join): JoinReq, LeaveReq and MembersReq as
// the coordinator answers them, and the points where membership changes. Invariant: the set of
// generators changes only at a weight sync (admit_members before it, settle_members after it), so
// a joiner gets the full weights before its first work and a leaver's last work is done before
// its leave is answered; what a dead member held is generated again by the others (rollout.cpp's
// failover), so every episode is trained exactly once.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "coordinator_internal.h"
#include "troupe/envs/env_pool.h"
#include "troupe/runtime/system.h"

namespace troupe::actors::coord {

namespace {

// The step in progress (the latest one whose rollout was asked for): what joins and leaves are dated by.
int64_t step_now(const RunState& s) { return std::max({s.step, s.done_step, s.membership.step}); }

std::string node_text(const MemberRecord& m) {
  return m.name + " (node " + std::to_string(m.node) + ", " + (m.host.empty() ? m.endpoint : m.host) + ")";
}

MemberRecord* member_at(RunState& s, std::uint32_t node) {
  for (auto& m : s.membership.members)
    if (m.node == node && m.state != "left" && m.state != "down") return &m;
  return nullptr;
}

// Why an env server cannot join env `r.env`'s pool, or ok.
Status check_env_join(const RunState& s, const JoinReq& r) {
  for (const auto& e : s.cfg.envs) {
    if (e.name != r.env) continue;
    if (e.addresses.empty())
      return invalid_input("--env " + r.env + ": the job serves this env without a pool of servers (envs[].addresses), "
                           "so no server can join it");
    TROUPE_TRY(envs::check_pool_address(r.env_address, e.type == EnvType::nemo_gym));
    for (const auto& m : s.membership.members)
      if (m.role == "env" && m.env_address == r.env_address && (m.state == "active" || m.state == "leaving"))
        return invalid_input("env server " + r.env_address + " is in the pool already (as " + m.name + ")");
    return {};
  }
  std::string names;
  for (const auto& e : s.cfg.envs) names += (names.empty() ? "" : ", ") + e.name;
  return invalid_input("--env " + r.env + ": the job has no such env (its envs: " + names + ")");
}

// Why the joiner cannot join, or ok.
Status check_join(const RunState& s, const JoinReq& r) {
  const MembershipOptions& o = s.hooks.membership;
  if (!o.accept)
    return invalid_input("this job admits no members: cluster.join is false in its config");
  if (r.role != "generator" && r.role != "scorer" && r.role != "env")
    return invalid_input("--role " + r.role + ": a member joins as a generator, a scorer or an env server");
  if (r.role == "env") {
    TROUPE_TRY(check_env_join(s, r));
  } else if (r.model_hash != o.model_hash) {
    return invalid_input("refused: the joiner's model " + r.model_name + " (hash " + r.model_hash +
                         ") is not the job's model " + o.model_name + " (hash " + o.model_hash + ")");
  }
  if (r.node == 0 || r.endpoint.empty())
    return invalid_input("a joiner needs a node id other than 0 and an endpoint (got node " + std::to_string(r.node) +
                         ", endpoint '" + r.endpoint + "')");
  if (s.peers.system)
    for (const auto& p : s.peers.system->peers())
      if (p.node == r.node)
        return invalid_input("node id " + std::to_string(r.node) + " is in use by " + p.role + " at " + p.endpoint +
                             ": join again (a joiner draws a new id each time)");
  return {};
}

bool loopback_endpoint(const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  const std::string host = endpoint.substr(6);
  return host.rfind("127.", 0) == 0 || host.rfind("localhost:", 0) == 0 || host.rfind("[::1]", 0) == 0;
}

// Whether the job's nodes can reach a member listening at `endpoint` (so a relay tree may pass
// versions through it): a tcp address that is not loopback, or a loopback one when the job's own
// nodes listen on loopback too (they share the member's host).
bool reachable_by_job(const RunState& s, const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  if (!loopback_endpoint(endpoint)) return true;
  if (!s.peers.system || !loopback_endpoint(s.peers.system->endpoint())) return false;
  for (const auto& p : s.peers.system->peers())
    if (p.role.rfind("joined-", 0) != 0 && p.endpoint.rfind("tcp://", 0) == 0 && !loopback_endpoint(p.endpoint))
      return false;
  return true;
}

// Tells every env worker that env server `m` joined (add) or left its env's pool (from the
// handlers as from the sync's coroutine: sent by the node, not by an actor's context).
void announce_env_server(RunState& s, const MemberRecord& m, bool add) {
  if (!s.peers.system) return;
  for (const auto& w : s.peers.env_workers) (void)s.peers.system->send(w, EnvPoolMember{m.env, m.env_address, add});
}

json member_row(const std::string& name, const std::string& role, std::uint32_t node,
                const std::string& state, int64_t version) {
  return json{{"name", name}, {"role", role}, {"node", node}, {"state", state}, {"version", version}};
}

}  // namespace

Status on_join(RunState& s, runtime::Context& ctx, const JoinReq& r) {
  if (!s.peers.system) return make_error(ErrorCode::internal, "membership: the coordinator has no actor system");
  Status st = check_join(s, r);
  // the answer, a refusal too, needs the way back (not for an id in use: that node is someone else)
  if (st.ok() || st.error().message.find("is in use by") == std::string::npos) {
    const std::string role = std::string("joined-") + (st.ok() ? r.role : "refused");
    if (Status c = s.peers.system->connect({runtime::PeerInfo{r.node, r.endpoint, role, r.curve_public_key}}); !c.ok())
      return c;
  }
  if (!st.ok()) {
    s.log("membership: refused a " + r.role + " from " + r.host + " (" + r.endpoint + "): " + st.error().message);
    return st;
  }
  MemberRecord m;
  size_t same_role = r.role == "generator" ? s.peers.generators.size() : r.role == "scorer" ? s.peers.scorers.size() : 0;
  for (const auto& other : s.membership.members)
    if (other.role == r.role && (other.state == "pending" || r.role == "env")) ++same_role;
  m.name = (r.role == "env" ? "env_server" : r.role) + std::to_string(same_role);
  m.role = r.role;
  m.host = r.host;
  m.endpoint = r.endpoint;
  m.node = r.node;
  m.capacity = r.capacity;
  m.joined_step = step_now(s);
  m.relays = r.role == "generator" && reachable_by_job(s, r.endpoint);
  if (r.role == "env") {  // a pool takes a server at once: episodes are independent of weight versions
    m.env = r.env;
    m.env_address = r.env_address;
    m.state = "active";
    m.admitted_step = m.joined_step;
    announce_env_server(s, m, true);
    s.log("membership: env server " + r.env_address + " (" + m.name + ", from " + r.host + ") joined env '" + r.env +
          "' during step " + std::to_string(m.joined_step) + ": every env worker adds it to its pool now");
    s.membership.members.push_back(m);
    write_members(s);
    return ctx.reply(JoinRep{m.name, m.joined_step, s.version});
  }
  s.log("membership: " + node_text(m) + " joined during step " + std::to_string(m.joined_step) + " with capacity " +
              std::to_string(r.capacity) + "; it takes work after the next weight sync" +
              (r.role != "generator" ? ""
               : m.relays        ? " (the job's nodes reach it: a relay tree may pass versions through it)"
                                 : " (a leaf of rank 0 in a relay tree: the job's nodes may not reach " + r.endpoint + ")"));
  s.membership.members.push_back(m);
  write_members(s);
  return ctx.reply(JoinRep{m.name, m.joined_step, s.version});
}

Status on_leave(RunState& s, runtime::Context& ctx, const LeaveReq& r) {
  MemberRecord* m = member_at(s, r.node);
  if (!m || m->state == "leaving")
    return invalid_input("node " + std::to_string(r.node) + " is no member that joined this job (or it is leaving)");
  m->leave_reply = ctx.reply_later();
  if (m->role == "env") {  // out of the pools now: its episodes in flight fail and are retried on the others
    announce_env_server(s, *m, false);
    m->state = "left";
    m->left_step = step_now(s);
    s.log("membership: env server " + m->env_address + " (" + m->name + ") left env '" + m->env + "' during step " +
          std::to_string(m->left_step) + ": out of every pool; its episodes in flight are retried on the others");
    write_members(s);
    return m->leave_reply.send(LeaveRep{m->left_step});
  }
  if (m->state == "pending") {
    m->state = "left";
    m->left_step = step_now(s);
    s.log("membership: " + node_text(*m) + " left before it took work");
    write_members(s);
    return m->leave_reply.send(LeaveRep{m->left_step});
  }
  m->state = "leaving";
  if (m->role == "generator") {
    s.membership.leaving.resize(s.peers.generators.size(), 0);
    s.membership.leaving[static_cast<size_t>(m->index)] = 1;
  }
  // sync mode: every request of the step is answered by its weight sync; async: the rollouts
  // requested before the leave are trained within max_staleness + 1 steps
  m->leave_at_sync = s.membership.syncs + (s.cfg.rollout.async ? s.cfg.rollout.max_staleness + 2 : 1);
  s.log("membership: " + node_text(*m) + " is leaving during step " + std::to_string(step_now(s)) +
              ": no more work; its leave is answered once the work it has is done");
  write_members(s);
  return {};
}

Status on_members(RunState& s, runtime::Context& ctx, const MembersReq& r) {
  const std::uint32_t node = ctx.sender().node;
  if (node != 0 && s.peers.system && !r.endpoint.empty()) {
    bool known = false;
    for (const auto& p : s.peers.system->peers()) known = known || p.node == node;
    if (!known)  // troupe status from another process: the answer needs a way back
      TROUPE_TRY(s.peers.system->connect({runtime::PeerInfo{node, r.endpoint, "joined-status", r.curve_public_key}}));
  }
  return ctx.reply(MembersRep{members_json(s).dump()});
}

bool members_pending(const RunState& s) {
  for (const auto& m : s.membership.members)
    if (m.state == "pending") return true;
  return false;
}

void admit_members(RunState& s) {
  bool changed = false;
  for (auto& m : s.membership.members) {
    if (m.state != "pending") continue;
    changed = true;
    if (s.peers.system && s.peers.system->node_is_down(m.node)) {
      m.state = "down";
      s.log("membership: " + node_text(m) + " went down before it was admitted");
      continue;
    }
    const runtime::ActorId id = runtime::ActorSystem::named(m.node, m.role);
    auto& list = m.role == "generator" ? s.peers.generators : s.peers.scorers;
    m.index = static_cast<int64_t>(list.size());
    list.push_back(id);
    if (m.role == "generator") {  // no work until this sync's full weights are there (settle_members)
      s.membership.min_version.resize(list.size(), -1);
      s.membership.min_version.back() = std::numeric_limits<int64_t>::max();
    }
    m.state = "active";
    m.admitted_step = step_now(s);
    s.log("membership: " + node_text(m) + " admitted at the weight sync of step " + std::to_string(m.admitted_step) +
                (m.role == "generator" ? ": the full weights go to it now" : ""));
  }
  if (changed) write_members(s);
}

void settle_members(RunState& s, int64_t version) {
  ++s.membership.syncs;
  bool changed = false;
  for (auto& m : s.membership.members) {
    if (m.role == "generator" && m.index >= 0 && static_cast<size_t>(m.index) < s.membership.min_version.size() &&
        s.membership.min_version[static_cast<size_t>(m.index)] == std::numeric_limits<int64_t>::max())
      s.membership.min_version[static_cast<size_t>(m.index)] = version;  // the version of its full weights
    if (m.state == "leaving" && m.leave_at_sync <= s.membership.syncs) {
      m.state = "left";
      m.left_step = step_now(s);
      if (m.leave_reply) (void)m.leave_reply.send(LeaveRep{m.left_step});
      s.log("membership: " + node_text(m) + " left after step " + std::to_string(m.left_step) + ", its work done");
      changed = true;
    } else if ((m.state == "active" || m.state == "leaving") && s.peers.system && s.peers.system->node_is_down(m.node)) {
      m.state = "down";
      m.left_step = step_now(s);
      if (m.role == "generator") ++s.membership.of(static_cast<size_t>(m.index)).failures;
      if (m.role == "env") announce_env_server(s, m, false);
      s.log("membership: " + node_text(m) + " is down (silent for cluster.peer_timeout_s); " +
            (m.role == "env" ? "its server leaves every pool (its episodes in flight are retried on the others)"
                             : "its episodes in flight were generated again by the other generators"));
      changed = true;
    }
  }
  (void)changed;
  if (s.hooks.membership.accept) write_members(s);  // versions and loads move every sync
}

void note_sampled(RunState& s, size_t g, size_t samples, int64_t step) {
  s.membership.step = std::max(s.membership.step, step);
  GeneratorLoad& l = s.membership.of(g);
  ++l.requests;
  l.samples += static_cast<int64_t>(samples);
  if (l.last_step != step) l.last_samples = 0;
  l.last_step = step;
  l.last_samples += static_cast<int64_t>(samples);
  for (auto& m : s.membership.members)
    if (m.role == "generator" && m.index == static_cast<int64_t>(g) && m.first_work_step < 0) {
      m.first_work_step = step;
      s.log("membership: " + node_text(m) + " sampled its first rollout at step " + std::to_string(step) +
                  " (joined during step " + std::to_string(m.joined_step) + ")");
    }
}

void note_failed(RunState& s, size_t g) { ++s.membership.of(g).failures; }

json members_json(const RunState& s) {
  json rows = json::array();
  for (size_t i = 0; i < s.peers.learners.size(); ++i)
    rows.push_back(member_row("learner" + std::to_string(i), "learner", s.peers.learners[i].node, "active", s.version));
  for (size_t g = 0; g < s.peers.generators.size(); ++g) {
    std::string name = "generator" + std::to_string(g), state = s.generator_alive(g) ? "active" : "down";
    json extra = json::object();
    for (const auto& m : s.membership.members)
      if (m.role == "generator" && m.index == static_cast<int64_t>(g)) {
        name = m.name;
        state = m.state;
        extra = json{{"host", m.host}, {"endpoint", m.endpoint}, {"capacity", m.capacity}, {"joined_step", m.joined_step},
                     {"first_work_step", m.first_work_step}, {"relays", m.relays}};
      }
    json row = member_row(name, "generator", s.peers.generators[g].node, state,
                          s.weight_sync ? s.weight_sync->held(g) : -1);
    const GeneratorLoad l = g < s.membership.load.size() ? s.membership.load[g] : GeneratorLoad{};
    row["requests"] = l.requests;
    row["samples"] = l.samples;
    row["last_step"] = l.last_step;
    row["last_step_samples"] = l.last_samples;
    row["failures"] = l.failures;
    row.update(extra);
    rows.push_back(row);
  }
  for (size_t i = 0; i < s.peers.env_workers.size(); ++i)
    rows.push_back(member_row("env" + std::to_string(i), "env", s.peers.env_workers[i].node, "active", -1));
  for (size_t i = 0; i < s.peers.scorers.size(); ++i)
    rows.push_back(member_row("scorer" + std::to_string(i), "scorer", s.peers.scorers[i].node, "active", -1));
  for (const auto& m : s.membership.members)  // not (or no longer) among the roles above
    if (m.index < 0) {
      json row{{"name", m.name}, {"role", m.role}, {"node", m.node}, {"state", m.state}, {"version", -1},
               {"host", m.host}, {"endpoint", m.endpoint}, {"joined_step", m.joined_step}};
      if (m.role == "env") row.update(json{{"env", m.env}, {"address", m.env_address}});
      rows.push_back(row);
    }
  return json{{"step", step_now(s)}, {"version", s.version}, {"members", rows}};
}

void write_members(const RunState& s) {
  const std::string& dir = s.hooks.membership.run_dir;
  if (dir.empty()) return;
  const std::string path = dir + "/members.json", tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return;  // status is a view: a run never fails for it
    out << members_json(s).dump(1) << "\n";
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
}

}  // namespace troupe::actors::coord
