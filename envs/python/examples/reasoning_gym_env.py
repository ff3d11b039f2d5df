"""A reasoning-gym task (https://github.com/open-thought/reasoning-gym) as a troupe env, through the
Python SDK: the env `type: reasoning_gym` runs the same code (troupe_env/reasoning_gym_env.py, where
its config keys are described). As a remote env:

    envs:
      - name: rg
        type: remote
        command: [python, envs/python/examples/reasoning_gym_env.py]
        config: {task: basic_arithmetic, size: 500, eval_size: 100}
"""
import os
import sys

# the SDK next to this file first (an installed troupe_env may be older)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from troupe_env.reasoning_gym_env import main  # noqa: E402

if __name__ == "__main__":
    main()
