/* troupe env plug-in C ABI, version 1. A shared library implements an environment by exporting
 * one function, troupe_env_plugin_init, which returns a table of C functions. Everything crossing
 * the boundary is a NUL-terminated UTF-8 string (JSON in the forms of envs/PROTOCOL.md) or an
 * opaque handle; strings the plug-in returns are freed by the host with the table's free_string.
 *
 * Rules for plug-in authors:
 *  - Return 0 on success and set *out_json to a string you allocated; on failure return nonzero and
 *    set *out_json to an error message (also freed with free_string). Never let a C++ exception
 *    escape a table function.
 *  - One handle runs one episode at a time; the host never calls one handle from two threads at once,
 *    but may use different handles from different threads.
 *  - JSON results: reset -> observation {"text", "messages", "metadata"}; step -> {"observation",
 *    "reward", "components", "done", "info"}; verify -> {"reward", "components", "info"};
 *    info -> {"name", "version", "multi_turn", "max_turns", "tools"}.
 *  - Bump nothing yourself: set abi_version = TROUPE_ENV_PLUGIN_ABI_VERSION and struct_size =
 *    sizeof(troupe_env_plugin). The host refuses a table whose abi_version differs from its own.
 */
#ifndef TROUPE_ENV_PLUGIN_H
#define TROUPE_ENV_PLUGIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TROUPE_ENV_PLUGIN_ABI_VERSION 1u
#define TROUPE_ENV_PLUGIN_INIT_SYMBOL "troupe_env_plugin_init"

#if defined(_WIN32)
#define TROUPE_ENV_PLUGIN_EXPORT __declspec(dllexport)
#else
#define TROUPE_ENV_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

typedef struct troupe_env troupe_env; /* opaque, defined by the plug-in */

typedef struct troupe_env_plugin {
  uint32_t abi_version; /* TROUPE_ENV_PLUGIN_ABI_VERSION */
  uint32_t struct_size; /* sizeof(troupe_env_plugin) as the plug-in was compiled */
  const char* name;     /* env name, e.g. "reverse" */
  const char* version;  /* env version, e.g. "1.0" (recorded in every trajectory) */

  /* Creates one env instance from its JSON config ("{}" when none). Per-actor setup goes here. */
  int (*create)(const char* config_json, troupe_env** out_env, char** out_error);
  /* Destroys an instance (per-actor teardown). Must accept any handle create() returned. */
  void (*destroy)(troupe_env* env);
  /* EnvInfo as JSON. */
  int (*info)(troupe_env* env, char** out_json);
  /* Starts an episode: options_json is {"split": "train"|"eval", ...}. Acquire episode resources. */
  int (*reset)(troupe_env* env, uint64_t seed, const char* options_json, char** out_json);
  /* One turn: action is the model's text for this turn. */
  int (*step)(troupe_env* env, const char* action, char** out_json);
  /* Scores a completion against a prompt's metadata (stateless). */
  int (*verify)(troupe_env* env, const char* metadata_json, const char* completion, char** out_json);
  /* Ends an episode (also after failures); frees episode resources. May be NULL. */
  void (*release)(troupe_env* env);
  /* Frees a string this plug-in returned. */
  void (*free_string)(char* s);
} troupe_env_plugin;

/* The one exported entry point. host_abi_version is the host's TROUPE_ENV_PLUGIN_ABI_VERSION; a
 * plug-in that cannot serve it may return NULL. The table must stay valid until the library is
 * unloaded. */
typedef const troupe_env_plugin* (*troupe_env_plugin_init_fn)(uint32_t host_abi_version);
TROUPE_ENV_PLUGIN_EXPORT const troupe_env_plugin* troupe_env_plugin_init(uint32_t host_abi_version);

#ifdef __cplusplus
}
#endif

#endif /* TROUPE_ENV_PLUGIN_H */
