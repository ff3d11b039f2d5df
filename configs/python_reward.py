"""The reward of configs/python_reward.yaml: a reward-only hook for the `dataset` env (verifier: python).

troupe calls score(prompt, response, reference, row) for every completion, in a pool of worker
processes; `reference` is the row's answer field as written in the JSONL (here an int), `row` the
whole row. A dict's numbers are reward components (logged as reward/<name>) and
the reward is their sum, unless the dict has a "reward" key.
"""
import re


def score(prompt, response, reference, row):
    """1 for the right sum, 0.1 for a wrong number, 0 for no number at all."""
    match = re.search(r"-?\d+", response)
    correct = match is not None and int(match.group()) == int(reference)
    wrong_number = match is not None and not correct
    return {"correct": 1.0 if correct else 0.0, "format": 0.1 if wrong_number else 0.0}
