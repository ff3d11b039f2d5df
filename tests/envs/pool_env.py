"""A pool member for envs.pool_run: single-digit sums served with the SDK (`a+b=`, reward 1 for
the sum), each reset's seed appended to --log; with --die-after N the server SIGKILLs itself on its
N-th reset (mid-run, before answering it), so the pool loses a member at a fixed point.

  pool_env.py --bind tcp://127.0.0.1:PORT --log FILE [--die-after N] [--delay SECONDS]
"""
import os
import random
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "envs", "python"))
from troupe_env import Env, serve  # noqa: E402


def arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


LOG = arg("--log")
DIE_AFTER = int(arg("--die-after", "0"))
DELAY = float(arg("--delay", "0"))
RESETS = [0]


class Sums(Env):
    name = "pool_sums"
    version = "1"

    def reset(self, seed, options):
        RESETS[0] += 1
        if DIE_AFTER and RESETS[0] >= DIE_AFTER:
            os.kill(os.getpid(), signal.SIGKILL)
        if DELAY:
            time.sleep(DELAY)
        with open(LOG, "a") as f:
            f.write(f"{seed}\n")
        r = random.Random(seed)
        a, b = r.randint(0, 4), r.randint(0, 4)
        return {"text": f"{a}+{b}=", "metadata": {"answer": str(a + b), "reference_completion": str(a + b)}}

    def verify(self, metadata, completion):
        return float(completion.strip() == metadata["answer"])


if __name__ == "__main__":
    serve(Sums)
