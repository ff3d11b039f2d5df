"""A multi-turn env with the SDK: guess a hidden word; after each guess the env says which letters
are in the right place (Wordle-style feedback). Reward 1 - (turns-1)/max_turns when solved.

Shows step() for multi-turn envs. Config: {"max_turns": 4}.
"""
import os
import random
import sys

try:
    from troupe_env import Env, EnvError, serve
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from troupe_env import Env, EnvError, serve

TRAIN_WORDS = ["cat", "dog", "sun", "map", "pen", "cup", "hat", "box"]
EVAL_WORDS = ["owl", "fig", "jam", "kit"]  # held out: never in training


class GuessWord(Env):
    name = "py_guess_word"
    version = "1"
    multi_turn = True

    def __init__(self, config=None):
        super().__init__(config)
        self.max_turns = int(self.config.get("max_turns", 4))
        if self.max_turns < 1:
            raise EnvError("max_turns must be >= 1")
        self.word, self.turns = None, 0

    def reset(self, seed, options):
        words = EVAL_WORDS if options.get("split") == "eval" else TRAIN_WORDS
        self.word, self.turns = random.Random(seed).choice(words), 0
        return {"text": f"Guess my {len(self.word)}-letter word. Reply with one word.",
                "metadata": {"answer": self.word, "reference_completion": self.word}}

    def step(self, action):
        if self.word is None:
            raise EnvError("step before reset")
        self.turns += 1
        guess = action.strip().lower()
        if guess == self.word:
            return {"reward": 1.0 - (self.turns - 1) / self.max_turns, "done": True, "info": {"termination": "solved"}}
        if self.turns >= self.max_turns:
            return {"reward": 0.0, "done": True, "info": {"termination": "max_turns"},
                    "observation": {"text": f"Out of turns. It was {self.word}."}}
        hint = "".join(c if i < len(guess) and guess[i] == c else "_" for i, c in enumerate(self.word))
        return {"reward": 0.0, "done": False, "observation": {"text": f"Not quite: {hint}"}}

    def verify(self, metadata, completion):
        return float(completion.strip().lower() == metadata["answer"])

    def release(self):
        self.word = None


if __name__ == "__main__":
    serve(GuessWord)
