"""A scripted three-turn env for e2e.chat_multi_turn (rollout.template chat): its reset gives chat
messages (a system prompt and a few-shot turn) that must become the prompt; turn 1 is answered as a
user turn, turn 2 as a tool message, and turn 3 ends the episode."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "envs", "python"))
from troupe_env import Env, serve  # noqa: E402


class ChatTurns(Env):
    name = "chat_turns"
    version = "1"
    multi_turn = True

    def reset(self, seed, options):
        self.turns = 0
        return {"text": "Say a word.",
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."},
                             {"role": "assistant", "content": "hi"}, {"role": "user", "content": "Say a word."}],
                "metadata": {"answer": "x", "reference_completion": "x"}}

    def step(self, action):
        self.turns += 1
        if self.turns == 1:
            return {"reward": 0.0, "done": False, "observation": {"text": "once more"}}
        if self.turns == 2:
            result = "{\"result\": 12}"
            return {"reward": 0.0, "done": False,
                    "observation": {"text": result, "messages": [{"role": "tool", "content": result}]},
                    "info": {"tool_calls": [{"name": "calculator"}]}}
        return {"reward": 1.0, "done": True, "components": {"solved": 1.0}}

    def verify(self, metadata, completion):
        return 0.0


if __name__ == "__main__":
    serve(ChatTurns)
