"""The baseline of `troupe bench envs` case verifiers_zmq: N episodes through the verifiers
package's own Python client (verifiers.v1.serve.EnvClient) against the env server at ADDRESS,
CONCURRENCY at a time, each calling the model at BASE_URL. Prints one JSON line
{"episodes_per_s": ...} (the client's start-up and first health check are not timed).
    bench_vf_client.py ADDRESS BASE_URL N CONCURRENCY"""
import asyncio
import json
import sys
import time

from verifiers.v1.configs.client import EvalClientConfig
from verifiers.v1.serve.client import EnvClient
from verifiers.v1.types import SamplingConfig


async def main(address, base_url, n, concurrency):
    client = EnvClient(address)
    await client.wait_for_server_startup(timeout=60)
    cfg = EvalClientConfig(base_url=base_url, api_key_var="TROUPE_VERIFIERS_API_KEY")
    sampling = SamplingConfig(temperature=1.0, max_tokens=4)
    gate = asyncio.Semaphore(concurrency)

    async def one(i):
        async with gate:
            await client.run(cfg, "policy", sampling, {"prompt": f"Say the letter {'abcdefgh'[i % 8]}.",
                                                        "answer": "abcdefgh"[i % 8]})

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    dt = time.perf_counter() - t0
    await client.close()
    print(json.dumps({"episodes_per_s": n / dt}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
