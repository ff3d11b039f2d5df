// A deliberately faulty env plug-in for the isolation tests. It behaves like a tiny echo env until
// an action/completion contains "BOOM" (or reset gets seed 666); then it does what config "fault"
// says: segfault, exit, throw (a C++ exception across the C ABI), hang (endless loop), or none.
// With config "fault_every_verify": N it also misbehaves on every Nth verify of this process (for
// whole training runs, which never write BOOM).
// Config "fault_every_reset" / "fault_every_step": N do the same on every Nth reset / step.
// Faults that answer instead of dying: badjson (a reply that is not JSON), badutf8 (JSON with
// invalid UTF-8), bigreward (verify/step reward 1e308), nonascii (reset: a prompt with "é").
// Built three more times with -DFAULTY_ABI_VERSION=99 (ABI mismatch), -DFAULTY_NO_INIT (no entry
// point) and -DFAULTY_STRUCT_SIZE=8 (a table whose struct_size is wrong).
#include <troupe/env_plugin.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#ifndef FAULTY_ABI_VERSION
#define FAULTY_ABI_VERSION TROUPE_ENV_PLUGIN_ABI_VERSION
#endif
#ifndef FAULTY_STRUCT_SIZE
#define FAULTY_STRUCT_SIZE sizeof(troupe_env_plugin)
#endif

namespace {

struct Faulty {
  std::string fault = "none";
  std::string last_prompt;
  long every_verify = 0, every_reset = 0, every_step = 0;
};
long verifies_in_this_process = 0, resets_in_this_process = 0, steps_in_this_process = 0;

char* dup(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

volatile int sink = 0;

// Faults that answer: the reply text (or "" when the fault is not one of them).
std::string bad_reply(const std::string& fault, const std::string& good) {
  if (fault == "badjson") return "{not json";
  if (fault == "badutf8") return "{\"text\": \"bad \xff\xfe bytes\", \"reward\": 0.5}";
  if (fault == "bigreward") return "{\"reward\": 1e308, \"done\": true}";
  if (fault == "nonascii") return "{\"text\": \"caf\xc3\xa9 1+1=\", \"metadata\": {\"answer\": \"2\"}}";
  return good;
}

void misbehave(const std::string& fault) {
  if (fault == "segfault") {
    std::raise(SIGSEGV);
  } else if (fault == "exit") {
    std::exit(3);
  } else if (fault == "throw") {
    throw std::runtime_error("faulty plug-in threw");
  } else if (fault == "hang") {
    for (;;) sink = sink + 1;  // an endless verifier
  }
}

int p_create(const char* config, troupe_env** out, char** err) {
  auto* f = new Faulty();
  std::string c = config;
  for (const char* name : {"segfault", "exit", "throw", "hang", "badjson", "badutf8", "bigreward", "nonascii"}) {
    if (c.find(std::string("\"") + name + "\"") != std::string::npos) f->fault = name;
  }
  if (auto at = c.find("\"fault_every_verify\""); at != std::string::npos) {
    auto colon = c.find(':', at);
    if (colon != std::string::npos) f->every_verify = std::strtol(c.c_str() + colon + 1, nullptr, 10);
  }
  for (auto [key, out] : {std::pair<const char*, long*>{"\"fault_every_reset\"", &f->every_reset},
                          std::pair<const char*, long*>{"\"fault_every_step\"", &f->every_step}}) {
    if (auto at = c.find(key); at != std::string::npos) {
      auto colon = c.find(':', at);
      if (colon != std::string::npos) *out = std::strtol(c.c_str() + colon + 1, nullptr, 10);
    }
  }
  if (c.find("\"fail_create\"") != std::string::npos) {
    delete f;
    *err = dup("create refused: fail_create was set");
    return 1;
  }
  *out = reinterpret_cast<troupe_env*>(f);
  return 0;
}
void p_destroy(troupe_env* e) { delete reinterpret_cast<Faulty*>(e); }
int p_info(troupe_env*, char** out) {
  *out = dup("{\"name\": \"faulty\", \"version\": \"0.1\", \"multi_turn\": false, \"max_turns\": 1}");
  return 0;
}
int p_reset(troupe_env* e, uint64_t seed, const char*, char** out) {
  auto* f = reinterpret_cast<Faulty*>(e);
  f->last_prompt = "say " + std::to_string(seed);
  const std::string good =
      "{\"text\": \"" + f->last_prompt + "\", \"metadata\": {\"answer\": \"" + std::to_string(seed) + "\"}}";
  if (seed == 666 || (f->every_reset > 0 && ++resets_in_this_process % f->every_reset == 0)) {
    misbehave(f->fault);
    *out = dup(bad_reply(f->fault, good));
    return 0;
  }
  *out = dup(good);
  return 0;
}
int p_step(troupe_env* e, const char* action, char** out) {
  auto* f = reinterpret_cast<Faulty*>(e);
  if (std::strstr(action, "BOOM")) misbehave(f->fault);
  if (f->every_step > 0 && ++steps_in_this_process % f->every_step == 0) {
    misbehave(f->fault);
    *out = dup(bad_reply(f->fault, "{\"reward\": 1.0, \"done\": true}"));
    return 0;
  }
  if (std::strstr(action, "BADJSON")) {
    *out = dup("{not json");
    return 0;
  }
  *out = dup("{\"reward\": 1.0, \"done\": true}");
  return 0;
}
int p_verify(troupe_env* e, const char*, const char* completion, char** out) {
  auto* f = reinterpret_cast<Faulty*>(e);
  if (std::strstr(completion, "BOOM")) misbehave(f->fault);
  if (f->every_verify > 0 && ++verifies_in_this_process % f->every_verify == 0) {
    misbehave(f->fault);
    *out = dup(bad_reply(f->fault, "{\"reward\": 0.5}"));
    return 0;
  }
  if (std::strstr(completion, "FAIL")) {
    *out = dup("verifier refused this completion");
    return 1;
  }
  *out = dup("{\"reward\": 0.5}");
  return 0;
}
void p_free(char* s) { std::free(s); }

const troupe_env_plugin kTable = {
    FAULTY_ABI_VERSION, FAULTY_STRUCT_SIZE, "faulty", "0.1", p_create, p_destroy, p_info, p_reset,
    p_step, p_verify, nullptr, p_free,
};

}  // namespace

#ifndef FAULTY_NO_INIT
extern "C" TROUPE_ENV_PLUGIN_EXPORT const troupe_env_plugin* troupe_env_plugin_init(uint32_t) { return &kTable; }
#else
extern "C" TROUPE_ENV_PLUGIN_EXPORT int not_the_entry_point() { return 0; }
#endif
