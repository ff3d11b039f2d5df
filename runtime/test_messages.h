// Message types shared by the runtime's unit tests (ids in the 9000s are reserved for tests).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/runtime/system.h"

namespace troupe::runtime::testing {

struct Ping {
  static constexpr std::uint32_t type_id = 9001;
  static constexpr const char* type_name = "test.Ping";
  std::uint64_t seq = 0;
  std::string text;
  template <class A>
  void serialize(A& ar) { ar(seq, text); }
};
struct Pong {
  static constexpr std::uint32_t type_id = 9002;
  static constexpr const char* type_name = "test.Pong";
  std::uint64_t seq = 0;
  std::string text;
  template <class A>
  void serialize(A& ar) { ar(seq, text); }
};
struct Trajectory {  // trajectory-like: ids, tokens, log-probs, reward
  static constexpr std::uint32_t type_id = 9003;
  static constexpr const char* type_name = "test.Trajectory";
  std::uint64_t episode = 0;
  std::int32_t policy_version = 0;
  std::vector<std::int32_t> tokens;
  std::vector<float> logprobs;
  float reward = 0;
  std::string env;
  template <class A>
  void serialize(A& ar) { ar(episode, policy_version, tokens, logprobs, reward, env); }
  friend bool operator==(const Trajectory&, const Trajectory&) = default;
};
struct Crash {
  static constexpr std::uint32_t type_id = 9004;
  static constexpr const char* type_name = "test.Crash";
  template <class A>
  void serialize(A&) {}
};

struct Go {
  static constexpr std::uint32_t type_id = 9005;
  std::string text;
  template <class A>
  void serialize(A& ar) { ar(text); }
};
struct Arm {
  static constexpr std::uint32_t type_id = 9006;
  template <class A>
  void serialize(A&) {}
};
struct Watch {
  static constexpr std::uint32_t type_id = 9007;
  std::uint64_t who = 0;
  template <class A>
  void serialize(A& ar) { ar(who); }
};

}  // namespace troupe::runtime::testing
