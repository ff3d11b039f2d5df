#!/usr/bin/env python3
"""Runs one NeMo Gym resource server on 127.0.0.1:PORT by itself, without NeMo Gym's head server,
model server or agent: what a troupe `type: nemo_gym` env with `command:` starts.

    python nemo_gym_serve.py MODULE [--class NAME] [--name NAME] [--config JSON] --port PORT

MODULE is the server's module, e.g. resources_servers.example_multi_step.app (from the nemo-gym
package, or any module on PYTHONPATH), or the path of a .py file (e.g. my_server/app.py, relative
to the working directory); the class is the SimpleResourcesServer subclass defined there unless
--class names it. It is built with its own config class: host, port, entrypoint, name, and the
fields of the JSON object in $TROUPE_NEMO_GYM_SERVER_CONFIG (what a troupe env's
config.server_config sets) updated by --config. A field the config class does not take is an
error (exit 2). The ServerClient reaches no other server, so resource servers that call a model
or judge server are not supported.
The app gets NeMo Gym's session middleware and GET / (liveness), as NeMo Gym's own launcher does.
When this Python has no nemo_gym, it re-runs itself with $TROUPE_CACHE (default ~/.cache/troupe)/
venv-nemo-gym/bin/python, the venv tests/envs/ensure_nemo_gym.py installs (nemo-gym 0.4.x needs
Python >= 3.12). Exit status 2: no nemo-gym, or the module or class cannot be loaded."""
import argparse
import importlib
import importlib.util
import inspect
import json
import os
import sys


def use_nemo_gym_python():
    try:
        import nemo_gym  # noqa: F401
        return
    except ImportError:
        pass
    cache = os.environ.get("TROUPE_CACHE", os.path.expanduser("~/.cache/troupe"))
    venv_py = os.path.join(cache, "venv-nemo-gym", "bin", "python")
    if os.path.exists(venv_py) and os.path.realpath(sys.executable) != os.path.realpath(venv_py):
        os.execv(venv_py, [venv_py] + sys.argv)
    print(f"nemo_gym_serve: no nemo-gym in {sys.executable} nor {venv_py}; install it with "
          "python tests/envs/ensure_nemo_gym.py (or pip install 'nemo-gym>=0.4,<0.5' under Python 3.12)",
          file=sys.stderr)
    sys.exit(2)


def import_server_module(name):
    """A module name, or a .py file path (its folder goes on sys.path, for its own imports)."""
    if name.endswith(".py") or os.sep in name:
        path = os.path.abspath(name)
        sys.path.insert(0, os.path.dirname(path))
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod
    return importlib.import_module(name)


def server_fields(args):
    """The server config's own fields: $TROUPE_NEMO_GYM_SERVER_CONFIG, then --config."""
    fields = {}
    for where, text in (("TROUPE_NEMO_GYM_SERVER_CONFIG", os.environ.get("TROUPE_NEMO_GYM_SERVER_CONFIG", "")),
                        ("--config", args.config)):
        if not text:
            continue
        try:
            value = json.loads(text)
        except ValueError as e:
            print(f"nemo_gym_serve: {where} is not JSON: {e}", file=sys.stderr)
            sys.exit(2)
        if not isinstance(value, dict):
            print(f"nemo_gym_serve: {where} must be a JSON object of config fields", file=sys.stderr)
            sys.exit(2)
        fields.update(value)
    return fields


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("module")
    ap.add_argument("--class", dest="cls", default="")
    ap.add_argument("--name", default="")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--config", default="", help="JSON object of the server config's own fields")
    args = ap.parse_args()
    fields = server_fields(args)
    use_nemo_gym_python()
    try:
        from nemo_gym.base_resources_server import SimpleResourcesServer
        from nemo_gym.config_types import BaseServerConfig
        from nemo_gym.server_utils import ServerClient
        from omegaconf import OmegaConf
        import uvicorn
        mod = import_server_module(args.module)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's setup
        print(f"nemo_gym_serve: cannot import {args.module}: {e!r}", file=sys.stderr)
        sys.exit(2)
    if args.cls:
        cls = getattr(mod, args.cls, None)
    else:
        found = [c for _, c in inspect.getmembers(mod, inspect.isclass)
                 if issubclass(c, SimpleResourcesServer) and c.__module__ == mod.__name__]
        cls = found[0] if len(found) == 1 else None
    if cls is None:
        print(f"nemo_gym_serve: {args.module} has no single SimpleResourcesServer class (use --class)", file=sys.stderr)
        sys.exit(2)
    config_cls = cls.model_fields["config"].annotation
    if args.module.endswith(".py") or os.sep in args.module:
        base = os.path.splitext(os.path.basename(args.module))[0]
        name = args.name or (os.path.basename(os.path.dirname(os.path.abspath(args.module))) if base == "app" else base)
    else:
        name = args.name or args.module.split(".")[-2 if args.module.endswith(".app") else -1]
    unknown = sorted(k for k in fields if k not in config_cls.model_fields)
    if unknown:
        print(f"nemo_gym_serve: {config_cls.__name__} has no field {', '.join(unknown)} (its fields: "
              f"{', '.join(config_cls.model_fields)})", file=sys.stderr)
        sys.exit(2)
    try:
        config = config_cls(**{**fields, "host": args.host, "port": args.port, "entrypoint": "app.py", "name": name})
    except Exception as e:  # noqa: BLE001 - pydantic's ValidationError names the field
        print(f"nemo_gym_serve: {cls.__name__}'s config {config_cls.__name__} refuses the server config "
              f"{json.dumps(fields)}: {e}", file=sys.stderr)
        sys.exit(2)
    client = ServerClient(head_server_config=BaseServerConfig(host=args.host, port=0),
                          global_config_dict=OmegaConf.create({}))
    server = cls(config=config, server_client=client)
    app = server.setup_webserver()
    server.setup_liveness(app)
    print(f"nemo_gym_serve: {cls.__name__} on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
