#!/usr/bin/env python3
"""Starts a verifiers (v1) environment server for troupe's `type: verifiers` env to connect to:
verifiers' own EnvServer (ZeroMQ ROUTER + msgpack) over the environment that TASKSET and HARNESS
make, with the harness's program run as a local subprocess (verifiers' default runtime is remote).
Prints "verifiers env server on ADDRESS" once it is bound, then serves until killed.

    python verifiers_serve.py --taskset ID [--harness ID] [--runtime subprocess] [--address tcp://127.0.0.1:5000]
                              [--env-config JSON]

ID is an installed taskset/harness package or a plugin module on PYTHONPATH (e.g. your own
my_env.py exporting a Taskset and a Harness subclass: --taskset my_env --harness my_env).
--harness defaults to the taskset's own harness, else verifiers' default. --env-config is a JSON
object merged into the env config (e.g. {"taskset": {...}, "agent": {"harness": {...}}}), as
verifiers' EnvConfig spells it. Address port 0 binds a free port (the printed address has it)."""
import argparse
import asyncio
import json
import sys


def merged(base, extra):
    out = dict(base)
    for k, v in extra.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--taskset", required=True)
    ap.add_argument("--harness", default="")
    ap.add_argument("--runtime", default="subprocess")
    ap.add_argument("--address", default="tcp://127.0.0.1:5000")
    ap.add_argument("--env-config", default="{}")
    a = ap.parse_args()
    try:
        from verifiers.v1.envs.single_agent import SingleAgentEnvConfig
        from verifiers.v1.serve.server import EnvServer
    except ImportError as e:
        print(f"verifiers_serve: {sys.executable} has no verifiers v1 ({e}): pip install verifiers", file=sys.stderr)
        sys.exit(2)
    agent = {"runtime": {"type": a.runtime}}
    if a.harness:
        agent["harness"] = {"id": a.harness}
    cfg = merged({"taskset": {"id": a.taskset}, "agent": agent}, json.loads(a.env_config))
    server = EnvServer(SingleAgentEnvConfig.model_validate(cfg), address=a.address)
    print(f"verifiers env server on {server.address}", flush=True)
    try:
        asyncio.run(server.run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
