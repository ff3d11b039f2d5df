// The .so loader: dlopen + troupe_env_plugin_init + table checks, and an Env adapter that turns
// C strings/JSON back into the Env API. The adapter never lets a plug-in's string leak: every
// returned string is copied and freed with the plug-in's free_string.
#include "troupe/envs/plugin.h"

#include <dlfcn.h>

#include "troupe/env_plugin.h"
#include "troupe/envs/client.h"

namespace troupe::envs {

class PluginLibrary {
 public:
  PluginLibrary(void* handle, const troupe_env_plugin* table, std::string path)
      : handle_(handle), table_(table), path_(std::move(path)) {}
  ~PluginLibrary() {
    if (handle_) dlclose(handle_);
  }
  const troupe_env_plugin& table() const { return *table_; }
  const std::string& path() const { return path_; }

 private:
  void* handle_;
  const troupe_env_plugin* table_;
  std::string path_;
};

std::string plugin_name(const PluginLibrary& lib) { return lib.table().name ? lib.table().name : ""; }

Result<std::shared_ptr<PluginLibrary>> load_plugin(const std::string& path) {
  const std::string where = "env plug-in " + path;
  // RTLD_LOCAL: two plug-ins never see each other's symbols. A path without '/' would search the
  // library path, which is never what a config means: make it relative to the working directory.
  std::string open_path = path.find('/') == std::string::npos ? "./" + path : path;
  void* h = dlopen(open_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return invalid_input(where + ": cannot load: " + (e ? e : "unknown dlopen error"));
  }
  dlerror();
  void* sym = dlsym(h, TROUPE_ENV_PLUGIN_INIT_SYMBOL);
  if (!sym) {
    dlclose(h);
    return invalid_input(where + ": missing symbol " TROUPE_ENV_PLUGIN_INIT_SYMBOL
                         " (a plug-in must export it with extern \"C\"; see troupe/env_plugin.h)");
  }
  auto init = reinterpret_cast<troupe_env_plugin_init_fn>(sym);
  const troupe_env_plugin* table = init(TROUPE_ENV_PLUGIN_ABI_VERSION);
  if (!table) {
    dlclose(h);
    return invalid_input(where + ": " TROUPE_ENV_PLUGIN_INIT_SYMBOL " returned NULL (the plug-in refused host ABI version " +
                         std::to_string(TROUPE_ENV_PLUGIN_ABI_VERSION) + ")");
  }
  if (table->abi_version != TROUPE_ENV_PLUGIN_ABI_VERSION) {
    uint32_t got = table->abi_version;
    dlclose(h);
    return invalid_input(where + ": ABI version mismatch: plug-in has " + std::to_string(got) + ", troupe expects " +
                         std::to_string(TROUPE_ENV_PLUGIN_ABI_VERSION) + " (rebuild it against this troupe's env_plugin.h)");
  }
  // Everything read from the table is copied before dlclose: the table lives in the library.
  if (table->struct_size < sizeof(troupe_env_plugin)) {
    const auto got = static_cast<unsigned long long>(table->struct_size);
    dlclose(h);
    return invalid_input(where + ": function table field 'struct_size' is " + std::to_string(got) +
                         ", smaller than sizeof(troupe_env_plugin) = " + std::to_string(sizeof(troupe_env_plugin)) +
                         " (set it to sizeof(troupe_env_plugin) and rebuild against this troupe's env_plugin.h)");
  }
  const char* missing = nullptr;
  if (!table->create) missing = "create";
  else if (!table->destroy) missing = "destroy";
  else if (!table->reset) missing = "reset";
  else if (!table->step) missing = "step";
  else if (!table->verify) missing = "verify";
  else if (!table->free_string) missing = "free_string";
  if (missing) {
    dlclose(h);
    return invalid_input(where + ": function table entry '" + missing + "' is NULL");
  }
  return std::make_shared<PluginLibrary>(h, table, path);
}

namespace {

class PluginEnv final : public Env {
 public:
  PluginEnv(std::shared_ptr<PluginLibrary> lib, troupe_env* env, EnvInfo info)
      : lib_(std::move(lib)), env_(env), info_(std::move(info)) {}
  ~PluginEnv() override { lib_->table().destroy(env_); }

  EnvInfo info() const override { return info_; }

  Result<Observation> reset(uint64_t seed, const ResetOptions& options) override {
    const std::string opts = to_json(options).dump();
    TROUPE_ASSIGN_OR_RETURN(json j, call("reset", [&](char** out) { return t().reset(env_, seed, opts.c_str(), out); }));
    return observation_from_json(j, where("reset"));
  }
  Result<StepResult> step(const std::string& action) override {
    TROUPE_ASSIGN_OR_RETURN(json j, call("step", [&](char** out) { return t().step(env_, action.c_str(), out); }));
    return step_result_from_json(j, where("step"));
  }
  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
    const std::string meta = metadata.dump();
    TROUPE_ASSIGN_OR_RETURN(json j, call("verify", [&](char** out) {
      return t().verify(env_, meta.c_str(), completion.c_str(), out);
    }));
    return verify_result_from_json(j, where("verify"));
  }
  void release() override {
    if (t().release) t().release(env_);
  }

 private:
  const troupe_env_plugin& t() const { return lib_->table(); }
  std::string where(const char* fn) const { return "env plug-in " + lib_->path() + ": " + fn; }

  template <class Fn>
  Result<json> call(const char* fn, Fn&& f) {
    char* out = nullptr;
    int rc = 0;
    try {
      rc = f(&out);
    } catch (...) {  // a plug-in broke the no-exceptions rule; do not let it unwind further
      if (out) t().free_string(out);
      return make_error(ErrorCode::internal, where(fn) + ": threw a C++ exception across the C ABI");
    }
    std::string text = out ? out : "";
    if (out) t().free_string(out);
    if (rc != 0) return make_error(ErrorCode::invalid_input, where(fn) + " failed: " + (text.empty() ? "(no message)" : text));
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded()) return make_error(ErrorCode::invalid_input, where(fn) + ": " + kProtocolErrorTag +
                                                   "returned invalid JSON (or invalid UTF-8): " + text.substr(0, 200));
    return j;
  }

  std::shared_ptr<PluginLibrary> lib_;
  troupe_env* env_;
  EnvInfo info_;
};

}  // namespace

Result<std::unique_ptr<Env>> make_plugin_env(const std::shared_ptr<PluginLibrary>& lib, const json& config) {
  const auto& t = lib->table();
  const std::string where = "env plug-in " + lib->path();
  const std::string cfg = (config.is_null() ? json::object() : config).dump();
  troupe_env* env = nullptr;
  char* err = nullptr;
  int rc = 0;
  try {
    rc = t.create(cfg.c_str(), &env, &err);
  } catch (...) {
    return make_error(ErrorCode::internal, where + ": create threw a C++ exception across the C ABI");
  }
  if (rc != 0 || !env) {
    std::string msg = err ? err : "(no message)";
    if (err) t.free_string(err);
    return invalid_input(where + ": create failed: " + msg);
  }
  if (err) t.free_string(err);
  EnvInfo info;
  info.name = t.name ? t.name : "plugin";
  info.version = t.version ? t.version : "1";
  if (t.info) {
    char* out = nullptr;
    if (t.info(env, &out) == 0 && out) {
      json j = json::parse(out, nullptr, false);
      t.free_string(out);
      auto parsed = env_info_from_json(j, where + ": info");
      if (!parsed.ok()) {
        t.destroy(env);
        return parsed.error();
      }
      info = *parsed;
      if (info.name.empty()) info.name = t.name ? t.name : "plugin";
    } else if (out) {
      t.free_string(out);
    }
  }
  return std::unique_ptr<Env>(new PluginEnv(lib, env, std::move(info)));
}

Result<EnvFactory> plugin_factory(const std::string& path) {
  TROUPE_ASSIGN_OR_RETURN(auto lib, load_plugin(path));
  return EnvFactory([lib](const json& config) { return make_plugin_env(lib, config); });
}

}  // namespace troupe::envs
