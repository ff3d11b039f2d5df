"""A scripted two-turn env for e2e.multi_turn: every episode is solved on its second turn (reward
0.5, component solved = 1) whatever the policy says, and a first-turn verify scores 0 — so a
multi-turn eval must report eval_accuracy 1, eval_reward_mean 0.5, eval_turns_mean 2."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "envs", "python"))
from troupe_env import Env, serve  # noqa: E402


class TwoTurn(Env):
    name = "two_turn"
    version = "1"
    multi_turn = True

    def reset(self, seed, options):
        self.turns = 0
        return {"text": "Say anything twice.", "metadata": {"answer": "x", "reference_completion": "x"}}

    def step(self, action):
        self.turns += 1
        if self.turns >= 2:
            return {"reward": 0.5, "done": True, "components": {"solved": 1.0}}
        return {"reward": 0.0, "done": False, "observation": {"text": "once more"}}

    def verify(self, metadata, completion):
        return 0.0


if __name__ == "__main__":
    serve(TwoTurn)
