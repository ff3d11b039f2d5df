"""Any reasoning-gym task (https://github.com/open-thought/reasoning-gym) as a troupe env: what
`envs: - type: reasoning_gym` runs (and envs/python/examples/reasoning_gym_env.py).

Config (the env's YAML `config:`, passed as $TROUPE_ENV_CONFIG or --config JSON):
    task: basic_arithmetic   # any reasoning_gym dataset name (alias: dataset)
    task_config: {}          # its own settings, passed to reasoning_gym.create_dataset (alias: dataset_config)
    size: 100000             # train items (generated on demand: a large size costs nothing up front)
    eval_size: 200           # held-out items
    seed: 0
    eval_fraction: 0.1       # share of the question space held out for eval

Splits: a question belongs to the eval split iff a stable hash of its text (64-bit FNV-1a, as
troupe's built-ins) falls in the eval_fraction bucket, so train and eval never share a question,
whatever the sizes and seeds. Train item `seed % size` is the generator's item at that index, or
the next one outside the eval bucket; eval items are the first eval_size items inside the bucket of
a second generator stream (seed + 1000003). The answer is read from the last <answer>...</answer>
(else the whole completion) and scored with the dataset's own score_answer (components: correct,
format).
"""
import os
import re
import sys

if __name__ == "__main__":  # run as a file: the SDK it belongs to first (an installed one may be older)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from troupe_env import Env, EnvError, serve  # noqa: E402

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_CACHE = {}  # config key -> _Task: shared by the instances of one process
_KNOWN = {"task", "dataset", "task_config", "dataset_config", "size", "eval_size", "seed", "eval_fraction"}
_MAX_PROBES = 10000  # items looked at for one train or eval item before giving up


def fnv1a(text):
    h = 0xCBF29CE484222325
    for b in text.encode("utf-8"):
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class _Task:
    def __init__(self, cfg):
        try:
            import reasoning_gym
        except ImportError as e:
            raise EnvError(f"reasoning_gym env: the reasoning-gym package is not installed here ({e})") from e
        self.cfg = cfg
        self.permille = int(cfg["eval_fraction"] * 1000 + 0.5)
        extra = cfg["task_config"]
        try:
            self.train = reasoning_gym.create_dataset(cfg["task"], size=cfg["size"], seed=cfg["seed"], **extra)
            stream = max(1000, cfg["eval_size"] * max(1, 1000 // max(1, self.permille)) * 4)
            self.held = reasoning_gym.create_dataset(cfg["task"], size=stream, seed=cfg["seed"] + 1_000_003, **extra)
        except Exception as e:  # noqa: BLE001 - an unknown task or a bad task_config is the user's input
            raise EnvError(f"reasoning_gym env: cannot create task '{cfg['task']}' with {extra}: {e}") from e
        self.eval_index = []  # stream indices of the eval items found so far

    def held_out(self, entry):
        return fnv1a(str(entry["question"])) % 1000 < self.permille

    def train_item(self, seed):
        n = len(self.train)
        start = seed % n
        for k in range(min(n, _MAX_PROBES)):
            i = (start + k) % n
            entry = self.train[i]
            if not self.held_out(entry):
                return i, entry
        raise EnvError(f"reasoning_gym env: no train item near index {start} outside the eval bucket "
                       "(lower eval_fraction)")

    def eval_item(self, seed):
        want = seed % self.cfg["eval_size"]
        i = self.eval_index[-1] + 1 if self.eval_index else 0
        while len(self.eval_index) <= want:
            if i >= len(self.held) or i >= (want + 1) * _MAX_PROBES:
                raise EnvError(f"reasoning_gym env: found only {len(self.eval_index)} eval items of "
                               f"{self.cfg['eval_size']} (raise eval_fraction or lower eval_size)")
            if self.held_out(self.held[i]):
                self.eval_index.append(i)
            i += 1
        j = self.eval_index[want]
        return j, self.held[j]


def _settings(config):
    unknown = set(config) - _KNOWN
    if unknown:
        raise EnvError(f"reasoning_gym env: unknown config keys {sorted(unknown)} (known: {sorted(_KNOWN)})")
    task = config.get("task", config.get("dataset"))
    if not isinstance(task, str) or not task:
        raise EnvError("reasoning_gym env: config 'task' (a reasoning-gym dataset name) is required")
    extra = config.get("task_config", config.get("dataset_config", {}))
    if not isinstance(extra, dict):
        raise EnvError("reasoning_gym env: 'task_config' must be a mapping")
    cfg = {"task": task, "task_config": dict(extra), "size": config.get("size", 100000),
           "eval_size": config.get("eval_size", 200), "seed": config.get("seed", 0),
           "eval_fraction": config.get("eval_fraction", 0.1)}
    for k in ("size", "eval_size", "seed"):
        if not isinstance(cfg[k], int) or isinstance(cfg[k], bool) or cfg[k] < (0 if k == "seed" else 1):
            raise EnvError(f"reasoning_gym env: '{k}' must be an integer >= {0 if k == 'seed' else 1}")
    f = cfg["eval_fraction"]
    if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 < f < 1:
        raise EnvError("reasoning_gym env: 'eval_fraction' must be a number between 0 and 1 (exclusive)")
    return cfg


class ReasoningGymEnv(Env):
    version = "2"

    def __init__(self, config=None):
        super().__init__(config)
        cfg = _settings(self.config)
        key = repr(sorted((k, repr(v)) for k, v in cfg.items()))
        if key not in _CACHE:
            _CACHE[key] = _Task(cfg)
        self.task = _CACHE[key]
        self.name = "reasoning_gym/" + cfg["task"]

    def reset(self, seed, options):
        split = options.get("split", "train")
        index, entry = self.task.eval_item(seed) if split == "eval" else self.task.train_item(seed)
        answer = str(entry["answer"])
        prompt = str(entry["question"]) + "\nPut your final answer in <answer></answer>."
        return {"text": prompt,
                "metadata": {"answer": answer, "reference_completion": f"<answer>{answer}</answer>",
                             "split": split, "index": index, "task": self.task.cfg["task"]}}

    def verify(self, metadata, completion):
        split = metadata.get("split")
        ds = self.task.held if split == "eval" else self.task.train
        index = metadata.get("index")
        if not isinstance(index, int) or not 0 <= index < len(ds):
            raise EnvError("reasoning_gym env: metadata needs the 'index' and 'split' that reset() returned")
        entry = ds[index]
        found = _ANSWER.findall(completion)
        answer = found[-1].strip() if found else completion.strip()
        score = float(ds.score_answer(answer=answer, entry=entry) or 0.0)
        return {"reward": score, "components": {"correct": score, "format": 1.0 if found else 0.0}}


def main():
    serve(ReasoningGymEnv)


if __name__ == "__main__":
    main()
