"""A Python SDK env whose config names a JSONL file (`data`): the prompts are its rows. Used by
envs.reward_hook_run to check that a remote env's relative config paths arrive resolved against the
experiment YAML's folder (setup fails unless `data` is an absolute path to a file)."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "envs", "python"))
from troupe_env import Env, EnvError, serve  # noqa: E402


class Rows(Env):
    name = "config_path_rows"

    def setup(self):
        path = self.config.get("data", "")
        if not os.path.isabs(path) or not os.path.isfile(path):
            raise EnvError(f"config 'data' is {path!r}, not an absolute path to a file")
        with open(path) as f:
            self.rows = [json.loads(line) for line in f if line.strip()]

    def reset(self, seed, options):
        row = self.rows[seed % len(self.rows)]
        answer = str(row["answer"])
        return {"text": row["question"] + "=", "metadata": {"answer": answer, "reference_completion": answer}}

    def verify(self, metadata, completion):
        return float(completion.strip() == metadata["answer"])


if __name__ == "__main__":
    serve(Rows)
