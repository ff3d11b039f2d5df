// Every message type id troupe uses, in one table: a message struct's `type_id` is one of these
// names, never a bare number. Ids are stable (they travel in every envelope header) and unique:
// the static_assert below refuses a table in which two names share an id, and the test
// actors.message_ids fails when two linked message types claim the same id.
#pragma once

#include <cstdint>

namespace troupe::message_id {

// --- the roles' messages (actors/messages.h), 2000-2099 ---
inline constexpr std::uint32_t env_reset_req = 2001;
inline constexpr std::uint32_t env_obs = 2002;
inline constexpr std::uint32_t env_verify_req = 2003;
inline constexpr std::uint32_t env_verify_rep = 2004;
inline constexpr std::uint32_t env_step_req = 2005;
inline constexpr std::uint32_t env_release_req = 2006;
inline constexpr std::uint32_t generate_req = 2010;
inline constexpr std::uint32_t generate_rep = 2011;
inline constexpr std::uint32_t weights = 2012;
inline constexpr std::uint32_t ack = 2013;
inline constexpr std::uint32_t step_version = 2014;
inline constexpr std::uint32_t weights_part = 2015;  // weight_sync.relay_fanout: a part of a Weights down the relay tree
inline constexpr std::uint32_t relay_ack = 2016;     // the Acks of a relay's subtree
inline constexpr std::uint32_t train_req = 2020;
inline constexpr std::uint32_t train_rep = 2021;
inline constexpr std::uint32_t get_weights_req = 2022;
inline constexpr std::uint32_t checkpoint_req = 2023;
inline constexpr std::uint32_t checkpoint_rep = 2024;
// weights_from_shards: the learners' pieces straight to the generators (actors/weight_pieces.h)
inline constexpr std::uint32_t pieces_head = 2025;
inline constexpr std::uint32_t weights_piece = 2026;
inline constexpr std::uint32_t send_piece_req = 2027;
inline constexpr std::uint32_t send_piece_rep = 2028;
inline constexpr std::uint32_t score_req = 2030;  // a scorer: log-probs, generation (actors/scorer.h)
inline constexpr std::uint32_t score_rep = 2031;
inline constexpr std::uint32_t served_turns_req = 2090;
inline constexpr std::uint32_t served_turns_rep = 2091;
inline constexpr std::uint32_t serve_address_req = 2092;
inline constexpr std::uint32_t serve_address_rep = 2093;
inline constexpr std::uint32_t env_run_req = 2094;
inline constexpr std::uint32_t env_aggregate_req = 2095;
inline constexpr std::uint32_t env_aggregate_rep = 2096;
inline constexpr std::uint32_t weight_group_req = 2097;
inline constexpr std::uint32_t weight_group_rep = 2098;

// --- run control between the ranks' control actors (actors/messages.h), 2100-2109 ---
inline constexpr std::uint32_t stop_after_step = 2100;
inline constexpr std::uint32_t stop_run = 2101;

// --- membership: members joining a running job (`troupe join`, `troupe status`), 2110-2119 ---
inline constexpr std::uint32_t join_req = 2110;
inline constexpr std::uint32_t join_rep = 2111;
inline constexpr std::uint32_t leave_req = 2112;
inline constexpr std::uint32_t leave_rep = 2113;
inline constexpr std::uint32_t members_req = 2114;
inline constexpr std::uint32_t members_rep = 2115;
inline constexpr std::uint32_t env_pool_member = 2116;

// --- `troupe bench` (launch/bench), 7000-7099 and 9600-9699 ---
inline constexpr std::uint32_t bench_blob = 7001;
inline constexpr std::uint32_t bench_call = 7002;
inline constexpr std::uint32_t bench_trajectory = 7003;
inline constexpr std::uint32_t bench_rtt_go = 7004;
inline constexpr std::uint32_t bench_gate_open = 9601;

// --- tests' own message types, 9000-9599 (runtime/test_messages.h, tests/runtime/mpi_probe.cpp) ---
inline constexpr std::uint32_t test_first = 9000;
inline constexpr std::uint32_t test_last = 9599;

// The runtime's own types (heartbeats, error replies, down notices) are kSystemTypeBase + n
// (runtime/envelope.h), above every id here.

struct Entry {
  const char* name;
  std::uint32_t id;
};
inline constexpr Entry kTable[] = {
    {"env_reset_req", env_reset_req},       {"env_obs", env_obs},
    {"env_verify_req", env_verify_req},     {"env_verify_rep", env_verify_rep},
    {"env_step_req", env_step_req},         {"env_release_req", env_release_req},
    {"generate_req", generate_req},         {"generate_rep", generate_rep},
    {"weights", weights},                   {"ack", ack},
    {"step_version", step_version},         {"weights_part", weights_part},
    {"relay_ack", relay_ack},               {"train_req", train_req},
    {"train_rep", train_rep},               {"get_weights_req", get_weights_req},
    {"checkpoint_req", checkpoint_req},     {"checkpoint_rep", checkpoint_rep},
    {"pieces_head", pieces_head},           {"weights_piece", weights_piece},
    {"send_piece_req", send_piece_req},     {"send_piece_rep", send_piece_rep},
    {"score_req", score_req},               {"score_rep", score_rep},
    {"served_turns_req", served_turns_req}, {"served_turns_rep", served_turns_rep},
    {"serve_address_req", serve_address_req}, {"serve_address_rep", serve_address_rep},
    {"env_run_req", env_run_req},           {"env_aggregate_req", env_aggregate_req},
    {"env_aggregate_rep", env_aggregate_rep}, {"weight_group_req", weight_group_req},
    {"weight_group_rep", weight_group_rep}, {"stop_after_step", stop_after_step},
    {"stop_run", stop_run},                 {"join_req", join_req},
    {"join_rep", join_rep},                 {"leave_req", leave_req},
    {"leave_rep", leave_rep},               {"members_req", members_req},
    {"members_rep", members_rep},           {"env_pool_member", env_pool_member},
    {"bench_blob", bench_blob},
    {"bench_call", bench_call},             {"bench_trajectory", bench_trajectory},
    {"bench_rtt_go", bench_rtt_go},         {"bench_gate_open", bench_gate_open},
};

constexpr bool table_ids_unique() {
  for (const Entry& a : kTable) {
    int same = 0;
    for (const Entry& b : kTable) same += a.id == b.id ? 1 : 0;
    if (same != 1) return false;
    if (a.id >= test_first && a.id <= test_last) return false;  // the tests' range is theirs alone
  }
  return true;
}
static_assert(table_ids_unique(), "two names in troupe::message_id::kTable share an id");

}  // namespace troupe::message_id
