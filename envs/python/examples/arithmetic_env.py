"""A minimal single-turn env with the SDK: integer sums, exact match. Used by `troupe bench envs`.

    python envs/python/examples/arithmetic_env.py --bind ipc:///tmp/arith.sock
"""
import os
import random
import sys

try:
    from troupe_env import Env, serve
except ImportError:  # running from a checkout without `pip install ./envs/python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from troupe_env import Env, serve


class Arithmetic(Env):
    name = "py_arithmetic"
    version = "1"

    def reset(self, seed, options):
        rng = random.Random(seed * 2 + (1 if options.get("split") == "eval" else 0))
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return {"text": f"{a}+{b}=", "metadata": {"answer": str(a + b), "reference_completion": str(a + b)}}

    def verify(self, metadata, completion):
        return float(completion.strip() == metadata["answer"])


if __name__ == "__main__":
    serve(Arithmetic)
