"""Ray baseline for `troupe bench runtime` (calls_1KiB_*): a line server so the C++ bench can
interleave its own repetitions with Ray's. Commands on stdin: "pipelined N", "sync N", "quit";
answers "calls_per_s X" per command. Prints "ERROR ..." and exits 3 when Ray is unavailable."""
import os
import sys
import time

# The protocol owns the original stdout; anything Ray or its libraries print goes to stderr.
proto = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr


def say(text):
    proto.write(text + "\n")
    proto.flush()


try:
    import ray
except Exception as e:  # noqa: BLE001 - any import failure means "no baseline"
    say(f"ERROR import ray failed: {e}")
    sys.exit(3)

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")


@ray.remote
class Echo:
    def call(self, payload: bytes) -> bytes:
        return payload


actor = Echo.remote()
payload = b"x" * 1024
ray.get(actor.call.remote(payload))  # warm: the actor process is up
say("ready")
for line in sys.stdin:
    parts = line.split()
    if not parts or parts[0] == "quit":
        break
    n = int(parts[1])
    t0 = time.perf_counter()
    if parts[0] == "pipelined":
        ray.get([actor.call.remote(payload) for _ in range(n)])
    else:
        for _ in range(n):
            ray.get(actor.call.remote(payload))
    dt = time.perf_counter() - t0
    say(f"calls_per_s {n / dt}")
ray.shutdown()
