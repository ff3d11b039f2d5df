"""Starts a verifiers (v1) EnvServer for troupe_vf_echo at ADDRESS and prints the bound address."""
import asyncio
import sys

from verifiers.v1.configs.env import EnvConfig  # noqa: F401
from verifiers.v1.envs.single_agent import SingleAgentEnvConfig
from verifiers.v1.serve.server import EnvServer

address = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:0"
cfg = SingleAgentEnvConfig.model_validate({
    "taskset": {"id": "troupe_vf_echo"},
    "agent": {"harness": {"id": "troupe_vf_echo"}, "runtime": {"type": "subprocess"}},
})
server = EnvServer(cfg, address=address)
print(f"verifiers env server on {server.address}", flush=True)
asyncio.run(server.run())
