// The messages the roles exchange. Every one is a plain struct with a cereal serialize(), so the
// same code runs whether the peer is a thread (direct hand-off) or another rank (ipc/tcp).
// JSON-valued fields travel as their text. Type ids come from the one table, troupe/base/message_ids.h.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <cereal/types/common.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include "troupe/base/message_ids.h"
#include "troupe/base/result.h"
#include "troupe/learner/config.h"
#include "troupe/runtime/bytes.h"

namespace troupe::actors {

// ---- env worker ----
struct EnvResetReq {
  static constexpr std::uint32_t type_id = message_id::env_reset_req;
  static constexpr const char* type_name = "actors.EnvResetReq";
  std::string env;
  std::string episode_id;
  std::uint64_t seed = 0;
  std::int32_t split = 0;  // 0 train, 1 eval
  // train resets: the env's draw number (its n-th prompt of the run, counted by the coordinator
  // and checkpointed), given to the env as ResetOptions.extra["draw"]; -1: none
  std::int64_t draw = -1;
  template <class A>
  void serialize(A& ar) { ar(env, episode_id, seed, split, draw); }
};
struct EnvObs {
  static constexpr std::uint32_t type_id = message_id::env_obs;
  static constexpr const char* type_name = "actors.EnvObs";
  std::string text;
  std::string metadata_json = "{}";
  double reward = 0;   // step replies only
  bool done = false;   // step replies only
  std::string components_json = "{}";
  double env_s = 0;
  // A failed call: why (error), its kind (a trajectory termination: timeout, worker_crash,
  // protocol_error, env_error, invalid_reward) and whether the env is past its bounds (fatal).
  std::string error, reason;
  bool fatal = false;
  std::string info_json = "{}";      // step replies: the env's step info
  std::string messages_json = "[]";  // the observation's chat messages
  std::string env_version;
  template <class A>
  void serialize(A& ar) {
    ar(text, metadata_json, reward, done, components_json, env_s, error, reason, fatal, info_json, messages_json,
       env_version);
  }
};
struct EnvVerifyReq {  // score G completions of one prompt in one call
  static constexpr std::uint32_t type_id = message_id::env_verify_req;
  static constexpr const char* type_name = "actors.EnvVerifyReq";
  std::string env;
  std::string metadata_json = "{}";
  std::vector<std::string> completions;
  template <class A>
  void serialize(A& ar) { ar(env, metadata_json, completions); }
};
// What a caller's scorer requests cost and how they failed (metrics scorer/*; ScorerClient, the
// coordinator's teacher requests). Latency and batch size depend on timing.
struct ScorerStats {
  std::int64_t requests = 0;   // requests answered
  std::int64_t failures = 0;   // tries that failed (error reply, deadline, dead scorer), retried or not
  std::int64_t retries = 0;    // tries sent to another scorer after a failure
  double latency_s = 0;   // summed wall time of the answered requests (their last try)
  double latency_max_s = 0;    // the slowest answered request's wall time (its last try)
  std::int64_t batch_requests = 0;  // summed ScoreRep::batch_requests of the answered requests
  std::int64_t batch_requests_max = 0;  // the largest ScoreRep::batch_requests of the answered requests
  void answered(double seconds, std::int64_t batch) {
    ++requests, latency_s += seconds, batch_requests += batch;
    latency_max_s = std::max(latency_max_s, seconds), batch_requests_max = std::max(batch_requests_max, batch);
  }
  void add(const ScorerStats& o) {
    requests += o.requests, failures += o.failures, retries += o.retries, latency_s += o.latency_s;
    batch_requests += o.batch_requests;
    latency_max_s = std::max(latency_max_s, o.latency_max_s);
    batch_requests_max = std::max(batch_requests_max, o.batch_requests_max);
  }
  template <class A>
  void serialize(A& ar) { ar(requests, failures, retries, latency_s, latency_max_s, batch_requests, batch_requests_max); }
};
struct EnvVerifyRep {
  static constexpr std::uint32_t type_id = message_id::env_verify_rep;
  static constexpr const char* type_name = "actors.EnvVerifyRep";
  std::vector<double> rewards;
  std::vector<double> correct;       // components["correct"] when the env reports it, else reward >= 1
  std::vector<std::string> errors;   // "" = scored; else the episode failed (reward 0)
  double env_s = 0;
  std::vector<std::string> reasons;  // per completion: "" or the failure's kind (see EnvObs::reason)
  std::vector<std::string> components_json;  // per completion: the reward's parts
  bool fatal = false;                // the env is past its bounds (restarts): stop the run
  std::vector<std::string> infos_json;  // per completion: the verify's info ("{}": none; a NeMo Gym
                                        // /verify answer's extra fields under "fields")
  // the scorer requests this reply cost (cluster.scorers): a judge's local model, a reward model
  ScorerStats judge_scorer, reward_model_scorer;
  template <class A>
  void serialize(A& ar) {
    ar(rewards, correct, errors, env_s, reasons, components_json, fatal, infos_json, judge_scorer, reward_model_scorer);
  }
};
struct EnvStepReq {
  static constexpr std::uint32_t type_id = message_id::env_step_req;
  static constexpr const char* type_name = "actors.EnvStepReq";
  std::string env;
  std::string episode_id;
  std::string action;
  template <class A>
  void serialize(A& ar) { ar(env, episode_id, action); }
};
struct EnvReleaseReq {
  static constexpr std::uint32_t type_id = message_id::env_release_req;
  static constexpr const char* type_name = "actors.EnvReleaseReq";
  std::string env;
  std::string episode_id;
  template <class A>
  void serialize(A& ar) { ar(env, episode_id); }
};
// After an evaluation: the env's own metrics over the eval episodes it scored since the last ask
// (nemo_gym: the server's /aggregate_metrics). Reply EnvAggregateRep.
struct EnvAggregateReq {
  static constexpr std::uint32_t type_id = message_id::env_aggregate_req;
  static constexpr const char* type_name = "actors.EnvAggregateReq";
  std::string env;
  template <class A>
  void serialize(A& ar) { ar(env); }
};
struct EnvAggregateRep {
  static constexpr std::uint32_t type_id = message_id::env_aggregate_rep;
  static constexpr const char* type_name = "actors.EnvAggregateRep";
  std::string metrics_json = "{}";  // {name: number}; "episodes" says how many it covers
  std::string error;                // "" or why the env could not aggregate
  template <class A>
  void serialize(A& ar) { ar(metrics_json, error); }
};

// An episode the env runs itself (a verifiers env): it calls the model at base_url for every turn
// and answers with an EnvObs (reward, components_json, info_json; or error/reason/fatal).
struct EnvRunReq {
  static constexpr std::uint32_t type_id = message_id::env_run_req;
  static constexpr const char* type_name = "actors.EnvRunReq";
  std::string env;
  std::string episode_id;
  std::string metadata_json = "{}";  // what the episode's reset gave (the task data)
  std::string base_url;              // the model endpoint (a generator's rollout.serve URL + /v1)
  std::string model;                 // the model name to send: "episodes/EPISODE_ID" (ties requests to the episode)
  std::string sampling_json = "{}";  // temperature, top_p, max_tokens, ...
  template <class A>
  void serialize(A& ar) { ar(env, episode_id, metadata_json, base_url, model, sampling_json); }
};

// ---- rollout generator ----
// Per-token policy versions (GenSample, TrainSample): the tokens [first, second) of a completion of
// n tokens that versions[u] sampled, given version_starts (empty when none of them is in range).
inline std::pair<std::size_t, std::size_t> version_span(const std::vector<std::uint32_t>& version_starts,
                                                        std::size_t u, std::size_t n) {
  const std::size_t b = std::min<std::size_t>(version_starts[u], n);
  const std::size_t e = u + 1 < version_starts.size() ? std::min<std::size_t>(version_starts[u + 1], n) : n;
  return {b, std::max(b, e)};
}
struct GenSampling {
  float temperature = 1;
  std::int32_t top_k = 0;
  float top_p = 1;
  std::int32_t max_new_tokens = 32;
  std::uint64_t seed = 0;
  // The RNG stream of each prompt (policy::SamplingParams::streams); empty = the prompt's index.
  // The coordinator numbers a step's samples globally, so a sample draws the same randoms on
  // whichever generator samples it (and however many there are).
  std::vector<std::int32_t> streams;
  template <class A>
  void serialize(A& ar) { ar(temperature, top_k, top_p, max_new_tokens, seed, streams); }
};
struct GenerateReq {  // texts are formatted and tokenized by the generator
  static constexpr std::uint32_t type_id = message_id::generate_req;
  static constexpr const char* type_name = "actors.GenerateReq";
  std::vector<std::string> prompts;  // one per sample (a group repeats its prompt G times)
  GenSampling sampling;
  // Instead of prompts: token ids used as they are (multi-turn continuations; no template, no BOS added).
  std::vector<std::vector<std::int32_t>> prompt_tokens;
  // The policy version to sample with (async mode pins each step's rollout to one version, so
  // which weights sampled it never depends on timing): the generator first takes the Weights it
  // holds back up to this version; -1 = the newest it has. No prompts: only take them.
  std::int64_t policy_version = -1;
  std::int64_t step = 0;  // the global step it samples for (0: an evaluation); faults.generator_death_step
  // rollout.in_flight_updates: before decode step i * in_flight_every (i = 1, 2, ...) the generator
  // moves to the version the learners had once GRPO step in_flight_steps[i-1] was done (it waits
  // for that StepVersion); after the list's end it keeps the last one. Empty = one version.
  std::vector<std::int64_t> in_flight_steps;
  std::int32_t in_flight_every = 0;
  // rollout.template chat: per prompt, the env's chat messages (a JSON list; "" or "[]": none), which
  // then become the prompt instead of the text (roles.h encode_prompt). Empty: none for any prompt.
  std::vector<std::string> prompt_messages;
  template <class A>
  void serialize(A& ar) {
    ar(prompts, sampling, prompt_tokens, policy_version, step, in_flight_steps, in_flight_every, prompt_messages);
  }
};
// Coordinator -> generators (rollout.in_flight_updates): GRPO step `grpo_step` is done and the
// learners hold `version` (its Weights were sent before this). release = true: no further step
// will be done; a generation waiting for one goes on with the version it has.
struct StepVersion {
  static constexpr std::uint32_t type_id = message_id::step_version;
  static constexpr const char* type_name = "actors.StepVersion";
  std::int64_t grpo_step = 0;
  std::int64_t version = 0;
  bool release = false;
  template <class A>
  void serialize(A& ar) { ar(grpo_step, version, release); }
};
struct GenSample {
  std::vector<std::int32_t> prompt_tokens;
  std::vector<std::int32_t> tokens;
  std::vector<float> logprobs;
  std::string text;        // decoded completion, cut after a stop string
  bool truncated = false;  // hit max_new_tokens without EOS or a stop string
  bool prompt_cut = false; // the prompt was cut to max_prompt_length
  std::vector<float> mask;  // multi-turn: 1 on sampled tokens, 0 on env feedback (empty = all ones)
  // multi-turn: where each trained turn's tokens (its sampled ones, then the feedback) start in
  // `tokens`, and each turn's completion text
  std::vector<std::uint32_t> turn_starts;
  std::vector<std::string> turn_texts;
  // MoE: (tokens x MoE layers x top-k) the expert ids that routed the position sampling each token
  // (policy::Generation::experts); empty for a dense model and for multi-turn samples.
  std::vector<std::int32_t> experts;
  // rollout.in_flight_updates: the policy version of each completion token, compactly: tokens
  // [version_starts[i], version_starts[i+1]) were sampled by versions[i] (version_starts[0] = 0).
  // Empty = every token by the reply's policy_version.
  std::vector<std::uint32_t> version_starts;
  std::vector<std::int64_t> versions;
  template <class A>
  void serialize(A& ar) {
    ar(prompt_tokens, tokens, logprobs, text, truncated, prompt_cut, mask, turn_starts, turn_texts, experts,
       version_starts, versions);
  }
};
struct GenerateRep {
  static constexpr std::uint32_t type_id = message_id::generate_rep;
  static constexpr const char* type_name = "actors.GenerateRep";
  std::vector<GenSample> samples;
  std::int64_t policy_version = 0;
  double generate_s = 0;
  double version_wait_s = 0;  // in-flight updates: of generate_s, the time spent waiting for newer versions
  template <class A>
  void serialize(A& ar) { ar(samples, policy_version, generate_s, version_wait_s); }
};
// Learner 0 -> generators: the weights of policy version `version`, in one of three encodings
// (actors/weight_codec.h; docs/weight_sync.md):
//   raw (0):   `params` is the whole flat fp32 arena (tests and tools; no checksums);
//   full (1):  `payload` holds every value in the generators' dtype (fp32 or bf16 bits), uncompressed;
//   delta (2): `payload` holds, per chunk of `chunk_elements` values, the XOR of these values' bits
//              and those of version `base_version` (which the receiver must hold, else it refuses
//              the message): a bitmap of the values that changed and the byte planes of their XORs
//              (sparse), or the byte planes of every value's XOR (dense), zstd-compressed.
// `checksums` (full, delta): per tensor of the model's table, the xxh3-64 of its values as the
// receiver must hold them afterwards, in wire form (fp32 bytes, or the bf16 halves). With the probe on, `probe_tokens` and learner 0's log-probs
// of them with exactly these weights travel along; the receiver computes its own and compares.
// Only Generator::apply_weights_to (set_weights; the staging copy with in-flight updates) decodes and applies one.
struct Weights {
  static constexpr std::uint32_t type_id = message_id::weights;
  static constexpr const char* type_name = "actors.Weights";
  std::int64_t version = 0;
  std::vector<float> params;  // raw encoding only
  std::int64_t base_version = -1;  // delta: the version the XOR is against; else -1
  std::int32_t encoding = 0;       // WeightEncoding: 0 raw, 1 full, 2 delta, 3 device (values by broadcast)
  std::int32_t dtype = 0;          // WeightDtype: 0 fp32, 1 bf16 (full, delta)
  std::uint64_t elements = 0;      // values in the arena (full, delta)
  std::uint32_t chunk_elements = 0;       // values per chunk (the last one may be shorter)
  std::vector<std::uint64_t> chunk_bytes;  // per chunk: its bytes in payload
  std::vector<std::uint8_t> chunk_format;  // per chunk: bit 0 = a zstd frame (else as is), bit 1 = sparse
  // (a runtime::Bytes: a long payload is received as a view into the ZeroMQ message, not copied)
  runtime::Bytes payload;
  std::vector<std::uint64_t> checksums;    // per tensor, xxh3-64 of its values afterwards (wire form)
  std::uint64_t changed = 0;               // delta: values that differ from the base version
  std::vector<std::int32_t> probe_tokens;  // empty = no probe check
  std::vector<float> probe_logprobs;       // learner 0's, one per token after the first
  // delta: per chunk, its first value (the chunks follow the tensors, at most chunk_elements
  // values each); empty: chunks of chunk_elements values from the arena's start
  std::vector<std::uint64_t> chunk_starts;
  // A learner's piece of several runs of the whole arena (divided experts, weight_shards.h
  // expert_sync_runs): per run three numbers, its first value in the whole arena, its values and its
  // checksums; the runs' values, chunks and checksums follow one another in this message (as if the
  // runs were one arena). Empty: the piece is one run (or the message the whole arena).
  std::vector<std::uint64_t> runs;
  template <class A>
  void serialize(A& ar) {
    ar(version, params, base_version, encoding, dtype, elements, chunk_elements, chunk_bytes, chunk_format, payload,
       checksums, changed, probe_tokens, probe_logprobs, chunk_starts, runs);
  }
};
// Generator -> coordinator, the reply to a Weights request: what the generator holds now.
struct Ack {
  static constexpr std::uint32_t type_id = message_id::ack;
  static constexpr const char* type_name = "actors.Ack";
  std::int64_t value = 0;         // the version the generator holds (and samples with) now
  std::int32_t status = 0;        // WeightsStatus: 0 applied, 1 checksum_failed, 2 refused, 3 probe_mismatch
  std::int64_t version = 0;       // the version of the Weights message this answers
  std::string detail;             // why, when not applied (names the tensor, the versions or the position)
  std::int64_t probe_position = -1;  // probe_mismatch: the first position whose log-prob differs
  template <class A>
  void serialize(A& ar) { ar(value, status, version, detail, probe_position); }
};

// ---- weight_sync.relay_fanout: a Weights down the relay tree (weight_relay.h) ----
// One part of a Weights message, to a generator that applies it and passes it on to its children.
// Part 0 carries the message's every field but the payload (`head`); each part a run of the
// payload, in order. `subtree`/`index`: the generators below the receiver (actor, generator
// index), which it splits among at most `fanout` children. Parts before the last are sent
// without a reply; the last is a request answered with a RelayAck for the whole subtree.
struct WeightsPart {
  static constexpr std::uint32_t type_id = message_id::weights_part;
  static constexpr const char* type_name = "actors.WeightsPart";
  std::int64_t version = 0;
  std::int32_t part = 0, parts = 1;
  Weights head;           // part 0: the message without its payload
  runtime::Bytes bytes;   // this part's run of the payload
  std::vector<std::uint64_t> subtree;  // packed runtime::ActorId of every generator below the receiver
  std::vector<std::int32_t> index;     // their generator indices
  std::int32_t fanout = 2;
  std::int32_t to_index = 0;           // the receiver's own generator index (for its Ack)
  // Part 0, when the tree holds members that joined the job (they know rank 0's node only): where
  // each node of `subtree` listens and its CURVE key (parallel to subtree), and the sender's, so
  // the receiver can reach its children and answer its parent. Empty otherwise.
  std::vector<std::string> endpoints, keys;
  std::string from_endpoint, from_key;
  template <class A>
  void serialize(A& ar) {
    ar(version, part, parts, head, bytes, subtree, index, fanout, to_index, endpoints, keys, from_endpoint, from_key);
  }
};
// A relay -> its parent, the reply to a WeightsPart's last part: the Ack of every generator of
// its subtree that answered (itself first), and the ones found dead (`down`, with why).
struct RelayAck {
  static constexpr std::uint32_t type_id = message_id::relay_ack;
  static constexpr const char* type_name = "actors.RelayAck";
  std::vector<std::int32_t> index;
  std::vector<Ack> acks;
  std::vector<std::int32_t> down;
  std::vector<std::int32_t> down_code;  // each one's ErrorCode (peer_failed: its actor or rank is gone)
  std::vector<std::string> why;
  std::uint64_t relayed_bytes = 0;  // payload bytes the subtree's relays sent on
  template <class A>
  void serialize(A& ar) { ar(index, acks, down, down_code, why, relayed_bytes); }
};

// ---- weights_from_shards: the learners' pieces straight to the generators (weight_pieces.h) ----
// Coordinator -> a generator the root sends to (the relay tree's first level, or every generator
// of the star): one transmission's message without its payload (`head`: every Weights field but
// the payload), which the learners send it as WeightsPieces, and the generators below it (as a
// WeightsPart's subtree, passed on as WeightsParts). A request answered with a RelayAck for the
// whole subtree (itself first) once it applied the message and every child answered.
struct PiecesHead {
  static constexpr std::uint32_t type_id = message_id::pieces_head;
  static constexpr const char* type_name = "actors.PiecesHead";
  std::uint64_t send = 0;          // the transmission (the coordinator counts them): pieces carry it too
  Weights head;
  std::uint64_t payload_bytes = 0;  // the whole message's payload, every learner's piece of it in rank order
  std::vector<std::uint64_t> subtree;  // packed runtime::ActorId of every generator below the receiver
  std::vector<std::int32_t> index;     // their generator indices
  std::int32_t fanout = 2;
  std::int32_t to_index = 0;           // the receiver's own generator index (for its Ack)
  template <class A>
  void serialize(A& ar) { ar(send, head, payload_bytes, subtree, index, fanout, to_index); }
};
// A learner -> such a generator: a run of the message's payload (from the learner's piece) that
// starts at byte `at`. Sent as a request (answered with an Ack once copied: the learner keeps a
// few in flight per generator) in sync mode, without a reply in async mode.
struct WeightsPiece {
  static constexpr std::uint32_t type_id = message_id::weights_piece;
  static constexpr const char* type_name = "actors.WeightsPiece";
  std::uint64_t send = 0;
  std::uint64_t total = 0;  // the whole payload's bytes
  std::uint64_t at = 0;
  runtime::Bytes bytes;
  template <class A>
  void serialize(A& ar) { ar(send, total, at, bytes); }
};
// Coordinator -> a learner: send the piece it encoded last (of `version`) to `targets` as
// WeightsPieces of transmission `send`, its first byte at byte `at` of a payload of `total`.
struct SendPieceReq {
  static constexpr std::uint32_t type_id = message_id::send_piece_req;
  static constexpr const char* type_name = "actors.SendPieceReq";
  std::uint64_t send = 0;
  std::int64_t version = 0;
  std::vector<std::uint64_t> targets;  // packed runtime::ActorId
  std::uint64_t at = 0, total = 0;
  bool paced = true;  // a request per run, a few in flight per target (sync mode); else all sent at once
  // the piece itself in the reply too: for generators only rank 0 reaches (members that joined the
  // running job), to which the coordinator sends the joined message
  bool reply_payload = false;
  // A piece of several runs (Weights::runs): per run, in the piece's order, the byte of the payload
  // its first byte goes to and its bytes (two numbers each); empty: the piece's bytes go to `at` on.
  std::vector<std::uint64_t> spans;
  template <class A>
  void serialize(A& ar) { ar(send, version, targets, at, total, paced, reply_payload, spans); }
};
struct SendPieceRep {
  static constexpr std::uint32_t type_id = message_id::send_piece_rep;
  static constexpr const char* type_name = "actors.SendPieceRep";
  std::uint64_t bytes = 0;  // payload bytes this learner sent, summed over the targets
  std::string detail;       // the targets it could not send to, and why ("" when none)
  runtime::Bytes payload;   // reply_payload: the piece's payload
  template <class A>
  void serialize(A& ar) { ar(bytes, detail, payload); }
};

// ---- rollout.serve: the generator's OpenAI-compatible endpoint during a run ----
// One request the endpoint served for an episode, token for token (one per choice).
struct ServedTurn {
  std::vector<std::int32_t> prompt_tokens;  // as the endpoint rendered and tokenized the request
  std::vector<std::int32_t> tokens;         // sampled, a final stop token included
  std::vector<float> logprobs;              // of the sampling distribution, one per token
  std::int64_t policy_version = 0;          // the weights that sampled every token
  std::string finish;                       // stop, length (or error)
  std::string text;
  template <class A>
  void serialize(A& ar) { ar(prompt_tokens, tokens, logprobs, policy_version, finish, text); }
};
struct ServedTurnsReq {  // hand over (and forget) what the endpoint served for an episode
  static constexpr std::uint32_t type_id = message_id::served_turns_req;
  static constexpr const char* type_name = "actors.ServedTurnsReq";
  std::string episode_id;
  template <class A>
  void serialize(A& ar) { ar(episode_id); }
};
struct ServedTurnsRep {
  static constexpr std::uint32_t type_id = message_id::served_turns_rep;
  static constexpr const char* type_name = "actors.ServedTurnsRep";
  std::vector<ServedTurn> turns;  // in the order the requests finished
  template <class A>
  void serialize(A& ar) { ar(turns); }
};
struct ServeAddressReq {
  static constexpr std::uint32_t type_id = message_id::serve_address_req;
  static constexpr const char* type_name = "actors.ServeAddressReq";
  std::int32_t unused = 0;
  template <class A>
  void serialize(A& ar) { ar(unused); }
};
struct ServeAddressRep {
  static constexpr std::uint32_t type_id = message_id::serve_address_rep;
  static constexpr const char* type_name = "actors.ServeAddressRep";
  std::string url;  // http://HOST:PORT, "" when the generator serves no endpoint
  template <class A>
  void serialize(A& ar) { ar(url); }
};

// ---- learner ----
struct TrainSample {
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> completion;
  std::vector<float> mask;
  std::vector<float> old_logprobs;       // empty: the ratio is taken against the current weights
  std::vector<float> behavior_logprobs;  // the sampler's, for the truncated importance weight (or empty)
  float advantage = 0;
  bool truncated = false;
  std::int64_t policy_version = -1;    // the version that sampled it (-1: unknown, not scored for the mismatch metrics)
  std::vector<std::int32_t> experts;   // the sampler's expert ids (GenSample::experts), or empty
  // rollout.in_flight_updates: per completion token, the version that sampled it (as in GenSample:
  // tokens from version_starts[i] on by versions[i]); empty = every token by policy_version, which
  // is then the oldest of them.
  std::vector<std::uint32_t> version_starts;
  std::vector<std::int64_t> versions;
  // distill: the teacher's log-prob of each completion token, and with distill.topk k its k most
  // likely tokens and their log-probs at each completion position ((completion) x k); empty = none
  std::vector<float> teacher_logprobs;
  std::vector<std::int32_t> teacher_topk_ids;
  std::vector<float> teacher_topk_logprobs;
  template <class A>
  void serialize(A& ar) {
    ar(prompt, completion, mask, old_logprobs, behavior_logprobs, advantage, truncated, policy_version, experts,
       version_starts, versions, teacher_logprobs, teacher_topk_ids, teacher_topk_logprobs);
  }
};
struct TrainReq {
  static constexpr std::uint32_t type_id = message_id::train_req;
  static constexpr const char* type_name = "actors.TrainReq";
  learner::Phase phase = learner::Phase::grpo;
  std::int64_t step = 0;   // phase-local step (schedules)
  std::vector<TrainSample> samples;
  // Streamed GRPO batch (rollout.async_chunks > 1): true = a part, more parts of this step follow
  // (gradients accumulate, no update, empty metrics in the reply); the step's last part has false.
  bool more = false;
  template <class A>
  void serialize(A& ar) { ar(phase, step, samples, more); }
};
struct TrainRep {
  static constexpr std::uint32_t type_id = message_id::train_rep;
  static constexpr const char* type_name = "actors.TrainRep";
  std::string metrics_json = "{}";
  std::int64_t policy_version = 0;
  double train_s = 0;
  template <class A>
  void serialize(A& ar) { ar(metrics_json, policy_version, train_s); }
};
// Coordinator -> learner 0: its current weights for the generators, as a delta against
// `base_version` when that is the version it encoded last (and weight_sync says delta and the
// version is not a full_every one), else in full. Reply: Weights.
struct GetWeightsReq {
  static constexpr std::uint32_t type_id = message_id::get_weights_req;
  static constexpr const char* type_name = "actors.GetWeightsReq";
  std::int64_t base_version = -1;  // the version the receivers hold (-1: none, a full sync)
  // weight_sync.transport nccl: the values go by broadcast over the weight group (WeightGroupReq),
  // the reply carries only their version, checksums and probe (encoding 3, device)
  bool device = false;
  template <class A>
  void serialize(A& ar) { ar(base_version, device); }
};
// Coordinator -> learner 0 and the generators (weight_sync.transport nccl): the device group the
// weights are broadcast over (NCCL on cuda; in-process on cpu_fenced). op 0 (learner 0): make the
// group's id; op 1: join it as `rank` of `nranks` (learner 0 is rank 0, generator g is g + 1).
struct WeightGroupReq {
  static constexpr std::uint32_t type_id = message_id::weight_group_req;
  static constexpr const char* type_name = "actors.WeightGroupReq";
  std::int32_t op = 0;
  std::vector<std::uint8_t> id;
  std::int32_t nranks = 0;
  std::int32_t rank = 0;
  template <class A>
  void serialize(A& ar) { ar(op, id, nranks, rank); }
};
struct WeightGroupRep {
  static constexpr std::uint32_t type_id = message_id::weight_group_rep;
  static constexpr const char* type_name = "actors.WeightGroupRep";
  std::vector<std::uint8_t> id;  // op 0: the group's id
  template <class A>
  void serialize(A& ar) { ar(id); }
};
struct CheckpointReq {  // save (load = false) or load (load = true) a checkpoint
  static constexpr std::uint32_t type_id = message_id::checkpoint_req;
  static constexpr const char* type_name = "actors.CheckpointReq";
  bool load = false;
  std::string dir;  // save: checkpoints dir; load: a step_N dir
  std::int64_t step = 0;
  std::string extra_json = "{}";
  bool has_metric = false;
  double metric = 0;
  // save: the coordinator's async pipeline (rollouts finished but not trained yet, the episode
  // ledger; pipeline_state.h), written as pipeline.bin next to the weights; empty = none
  std::string pipeline;
  template <class A>
  void serialize(A& ar) { ar(load, dir, step, extra_json, has_metric, metric, pipeline); }
};
struct CheckpointRep {
  static constexpr std::uint32_t type_id = message_id::checkpoint_rep;
  static constexpr const char* type_name = "actors.CheckpointRep";
  std::string path;
  std::int64_t step = 0;
  std::int64_t policy_version = 0;
  std::string extra_json = "{}";
  std::string pipeline;  // load: the checkpoint's pipeline.bin (empty when it has none)
  template <class A>
  void serialize(A& ar) { ar(path, step, policy_version, extra_json, pipeline); }
};

// ---- scorer: a frozen model that scores or generates for every rollout (actors/scorer.h) ----
// What a ScoreReq asks. A new kind is one more enumerator here, one more branch in
// Scorer::run_batch (roles/scorer_role.cpp), and the fields it reads below.
enum class ScoreKind : std::int32_t {
  logprobs = 0,        // log p(seq[t] | seq[<t]) for t >= starts[i], and optionally the top-k per position
  generate = 1,        // texts completed from prompts (an LLM judge with a local model)
  sequence_score = 2,  // reserved: one scalar per sequence from a score head on its last token (reward models)
};
struct ScoreReq {
  static constexpr std::uint32_t type_id = message_id::score_req;
  static constexpr const char* type_name = "actors.ScoreReq";
  std::int32_t kind = 0;  // ScoreKind
  std::string model;      // which of the scorer's models: its path as the config names it
  // logprobs, sequence_score: whole token sequences (prompt + completion)
  std::vector<std::vector<std::int32_t>> sequences;
  std::vector<std::int32_t> starts;  // logprobs: per sequence, the first position scored (>= 1)
  std::int32_t topk = 0;             // logprobs: also the k most likely tokens of each scored position
  // generate: prompts as text (the model's tokenizer encodes them after BOS), greedy unless temperature > 0
  std::vector<std::string> prompts;
  std::int32_t max_new_tokens = 256;
  float temperature = 0;
  std::uint64_t seed = 0;
  template <class A>
  void serialize(A& ar) { ar(kind, model, sequences, starts, topk, prompts, max_new_tokens, temperature, seed); }
};
struct ScoreRep {
  static constexpr std::uint32_t type_id = message_id::score_rep;
  static constexpr const char* type_name = "actors.ScoreRep";
  std::string model_hash;      // xxh3 of the model's files: the version of the frozen model that answered
  std::string tokenizer_hash;  // its tokenizer's (tokenizer_fingerprint)
  // logprobs: per sequence, one value per scored position (size - start)
  std::vector<std::vector<float>> logprobs;
  // logprobs with topk k: per sequence, (size - start) x k ids and their log-probs, most likely first
  std::vector<std::vector<std::int32_t>> topk_ids;
  std::vector<std::vector<float>> topk_logprobs;
  std::vector<std::string> texts;  // generate: one per prompt
  std::vector<float> scores;       // sequence_score: one per sequence
  double compute_s = 0;            // the batch this request ran in
  double queue_s = 0;              // waiting for its batch
  std::int32_t batch_requests = 0; // requests that shared the batch (continuous batching)
  template <class A>
  void serialize(A& ar) {
    ar(model_hash, tokenizer_hash, logprobs, topk_ids, topk_logprobs, texts, scores, compute_s, queue_s,
       batch_requests);
  }
};

// ---- run control: the ranks' control actors (launch/) ----
// A rank that got SIGTERM/SIGINT -> rank 0: stop after the step in progress, with a final checkpoint.
struct StopAfterStep {
  static constexpr std::uint32_t type_id = message_id::stop_after_step;
  static constexpr const char* type_name = "launch.StopAfterStep";
  std::int32_t rank = 0;
  std::int32_t signal = 0;
  template <class A>
  void serialize(A& ar) { ar(rank, signal); }
};
// Rank 0 -> every other rank when the run is over: stop serving and shut down.
struct StopRun {
  static constexpr std::uint32_t type_id = message_id::stop_run;
  static constexpr const char* type_name = "launch.StopRun";
  std::int32_t code = 0;
  template <class A>
  void serialize(A& ar) { ar(code); }
};

// ---- membership: a process joining a running job (`troupe join`), `troupe status` ----
// Joiner -> the coordinator: admit this process's role. The joiner's node must be reachable at
// `endpoint` (the coordinator connects back to it, with `curve_public_key` under CURVE). Refused
// (an error reply, invalid_input) for another role, a node id in use, or another model hash.
struct JoinReq {
  static constexpr std::uint32_t type_id = message_id::join_req;
  static constexpr const char* type_name = "actors.JoinReq";
  std::string role;              // "generator", "scorer" or "env"
  std::uint32_t node = 0;        // the joiner's node id
  std::string endpoint;          // where the joiner's node listens (tcp://host:port)
  std::string curve_public_key;  // its CURVE key ("" without CURVE)
  std::string host;              // its host name (for troupe status and the logs)
  std::int32_t capacity = 1;     // compute threads it samples with
  std::string model_hash;        // member_model_hash of its config
  std::string model_name;        // what it calls its model (policy.path, or policy.model's shape)
  std::string env;               // role env: the env (an envs[].name whose addresses: pool it joins)
  std::string env_address;       // role env: the running env server's address (as in envs[].addresses)
  template <class A>
  void serialize(A& ar) { ar(role, node, endpoint, curve_public_key, host, capacity, model_hash, model_name, env, env_address); }
};
struct JoinRep {
  static constexpr std::uint32_t type_id = message_id::join_rep;
  static constexpr const char* type_name = "actors.JoinRep";
  std::string name;               // the member's name in the job ("generator3")
  std::int64_t step = 0;          // the job's step when it was admitted
  std::int64_t version = 0;       // the learners' policy version then
  template <class A>
  void serialize(A& ar) { ar(name, step, version); }
};
// A joined member -> the coordinator: send me no more work. Answered once the work already sent to
// it is done (at a later weight sync), or with an error when the node is no member.
struct LeaveReq {
  static constexpr std::uint32_t type_id = message_id::leave_req;
  static constexpr const char* type_name = "actors.LeaveReq";
  std::uint32_t node = 0;
  template <class A>
  void serialize(A& ar) { ar(node); }
};
struct LeaveRep {
  static constexpr std::uint32_t type_id = message_id::leave_rep;
  static constexpr const char* type_name = "actors.LeaveRep";
  std::int64_t step = 0;  // the step after which it got no more work
  template <class A>
  void serialize(A& ar) { ar(step); }
};
// `troupe status ADDRESS` -> the coordinator: the job's members, as the JSON status.json holds.
struct MembersReq {
  static constexpr std::uint32_t type_id = message_id::members_req;
  static constexpr const char* type_name = "actors.MembersReq";
  std::string endpoint;          // where the asking node listens (the coordinator connects back to answer)
  std::string curve_public_key;  // its CURVE key ("" without CURVE)
  template <class A>
  void serialize(A& ar) { ar(endpoint, curve_public_key); }
};
struct MembersRep {
  static constexpr std::uint32_t type_id = message_id::members_rep;
  static constexpr const char* type_name = "actors.MembersRep";
  std::string json;
  template <class A>
  void serialize(A& ar) { ar(json); }
};
// The coordinator -> every env worker: an env server joined (add) or left (not add) the job;
// the worker adds it to (removes it from) its process's pools of env `env` (envs::EnvPool).
struct EnvPoolMember {
  static constexpr std::uint32_t type_id = message_id::env_pool_member;
  static constexpr const char* type_name = "actors.EnvPoolMember";
  std::string env;
  std::string address;
  bool add = true;
  template <class A>
  void serialize(A& ar) { ar(env, address, add); }
};

// Every message type above, for registration and the id test.
template <class... M>
struct MessageList {};
using RoleMessages =
    MessageList<EnvResetReq, EnvObs, EnvVerifyReq, EnvVerifyRep, EnvStepReq, EnvReleaseReq, EnvAggregateReq,
                EnvAggregateRep, EnvRunReq, GenerateReq, StepVersion, GenerateRep, Weights, Ack, WeightsPart, RelayAck, PiecesHead,
                WeightsPiece, SendPieceReq, SendPieceRep, ServedTurnsReq,
                ServedTurnsRep, ServeAddressReq, ServeAddressRep, TrainReq, TrainRep, GetWeightsReq, WeightGroupReq,
                WeightGroupRep, CheckpointReq, CheckpointRep, ScoreReq, ScoreRep, StopAfterStep, StopRun, JoinReq, JoinRep, LeaveReq, LeaveRep,
                MembersReq, MembersRep, EnvPoolMember>;

// Registers every type of RoleMessages and the runtime's own with the runtime (the troupe binary
// calls it first thing): an error names both types when two claim one id.
Status register_messages();

}  // namespace troupe::actors
