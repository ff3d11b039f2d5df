#!/usr/bin/env python3
"""Writes a verifiers (v1) taskset's own tasks as JSON lines, one TaskData per line (what troupe's
`type: verifiers` client ships in each `run`): the taskset's load(), as the verifiers CLI reads it.
troupe runs this when an env's config names a `taskset` instead of inline `tasks`.

    python verifiers_tasks.py TASKSET_JSON OUT_FILE [--max-tasks N]

TASKSET_JSON is the taskset's config (verifiers' TasksetConfig: at least "id", the installed
taskset package or plugin module). An unbounded taskset needs --max-tasks. Exit status 2: no
verifiers, a taskset that cannot be loaded, or no tasks."""
import argparse
import itertools
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("taskset")
    ap.add_argument("out")
    ap.add_argument("--max-tasks", type=int, default=0)
    a = ap.parse_args()
    try:
        from verifiers.v1.configs.taskset import TasksetConfig
        from verifiers.v1.utils.loaders import load_taskset
    except ImportError as e:
        print(f"verifiers_tasks: {sys.executable} has no verifiers v1 ({e}): pip install verifiers, or set "
              "the env's config.python to a Python that has it", file=sys.stderr)
        sys.exit(2)
    try:
        taskset = load_taskset(TasksetConfig.model_validate(json.loads(a.taskset)))
        if not taskset.bounded and a.max_tasks <= 0:
            print("verifiers_tasks: the taskset is unbounded: set config.max_tasks", file=sys.stderr)
            sys.exit(2)
        tasks = iter(taskset) if a.max_tasks <= 0 else itertools.islice(taskset, a.max_tasks)
        n = 0
        with open(a.out, "w") as f:
            for task in tasks:
                f.write(json.dumps(task.data.model_dump(mode="json", exclude_none=True)) + "\n")
                n += 1
    except Exception as e:  # noqa: BLE001 - the taskset's own error, for the user
        print(f"verifiers_tasks: cannot load taskset {a.taskset}: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
    if n == 0:
        print(f"verifiers_tasks: taskset {a.taskset} has no tasks", file=sys.stderr)
        sys.exit(2)
    print(f"verifiers_tasks: {n} tasks of {a.taskset}", file=sys.stderr)


if __name__ == "__main__":
    main()
