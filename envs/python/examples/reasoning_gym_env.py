"""Wraps a reasoning-gym task (https://github.com/open-thought/reasoning-gym) as a troupe env.

Config (YAML `config:` of the env, passed as $TROUPE_ENV_CONFIG or --config JSON):
    dataset: basic_arithmetic   # any reasoning_gym dataset name
    size: 500                   # train items; eval_size held-out items
    eval_size: 100
    seed: 0
    dataset_config: {}          # extra arguments for reasoning_gym.create_dataset

The eval items come from a different generator seed, and any whose question also occurs in the
train items is dropped, so the splits are disjoint. The answer is read from the last
<answer>...</answer> (else the whole completion) and scored with the dataset's own score_answer.
"""
import os
import re
import sys

try:
    from troupe_env import Env, EnvError, serve
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from troupe_env import Env, EnvError, serve

import reasoning_gym

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_DATA = {}  # (dataset, size, seed, eval_size) -> (train, eval): shared by all instances


def _load(cfg):
    key = (cfg["dataset"], cfg["size"], cfg["seed"], cfg["eval_size"], repr(sorted(cfg["dataset_config"].items())))
    if key not in _DATA:
        extra = cfg["dataset_config"]
        train = reasoning_gym.create_dataset(cfg["dataset"], size=cfg["size"], seed=cfg["seed"], **extra)
        held = reasoning_gym.create_dataset(cfg["dataset"], size=cfg["eval_size"], seed=cfg["seed"] + 1_000_003, **extra)
        seen = {train[i]["question"] for i in range(len(train))}
        eval_items = [held[i] for i in range(len(held)) if held[i]["question"] not in seen]
        _DATA[key] = (train, [train[i] for i in range(len(train))], held, eval_items)
    return _DATA[key]


class ReasoningGymEnv(Env):
    version = "1"

    def __init__(self, config=None):
        super().__init__(config)
        known = {"dataset", "size", "eval_size", "seed", "dataset_config"}
        unknown = set(self.config) - known
        if unknown:
            raise EnvError(f"reasoning_gym env: unknown config keys {sorted(unknown)}")
        self.cfg = {"dataset": self.config.get("dataset", "basic_arithmetic"), "size": int(self.config.get("size", 500)),
                    "eval_size": int(self.config.get("eval_size", 100)), "seed": int(self.config.get("seed", 0)),
                    "dataset_config": dict(self.config.get("dataset_config", {}))}
        self.name = "reasoning_gym/" + self.cfg["dataset"]
        self.train_ds, self.train, self.eval_ds, self.eval = _load(self.cfg)
        if not self.eval:
            raise EnvError("reasoning_gym env: every eval item also occurs in train; raise eval_size or change seed")

    def reset(self, seed, options):
        split = options.get("split", "train")
        items = self.eval if split == "eval" else self.train
        index = seed % len(items)
        entry = items[index]
        answer = str(entry["answer"])
        prompt = entry["question"] + "\nPut your final answer in <answer></answer>."
        return {"text": prompt,
                "metadata": {"answer": answer, "reference_completion": f"<answer>{answer}</answer>",
                             "split": split, "index": index, "dataset": self.cfg["dataset"]}}

    def verify(self, metadata, completion):
        items = self.eval if metadata.get("split") == "eval" else self.train
        index = metadata.get("index")
        if not isinstance(index, int) or not 0 <= index < len(items):
            raise EnvError("reasoning_gym env: metadata needs the 'index' and 'split' that reset() returned")
        entry = items[index]
        found = _ANSWER.findall(completion)
        answer = found[-1].strip() if found else completion.strip()
        ds = self.eval_ds if metadata.get("split") == "eval" else self.train_ds
        score = float(ds.score_answer(answer=answer, entry=entry) or 0.0)
        return {"reward": score, "components": {"correct": score, "format": 1.0 if found else 0.0}}


if __name__ == "__main__":
    serve(ReasoningGymEnv)
