#!/usr/bin/env python3
"""Prints the path of a Python that has pyarrow and datasets (what the dataset_files tests write
their parquet and save_to_disk fixtures with, and what troupe's row reader runs): this Python when
it has both, else a venv under $TROUPE_CACHE (default ~/.cache/troupe)/venv-datasets, installed on
first use. Exit 1 with the reason when pip fails.
    ensure_pyarrow.py       -> last stdout line: that python"""
import fcntl
import os
import subprocess
import sys

CACHE = os.environ.get("TROUPE_CACHE", os.path.expanduser("~/.cache/troupe"))
VENV = os.path.join(CACHE, "venv-datasets")
VENV_PY = os.path.join(VENV, "bin", "python")
PROBE = "import pyarrow, datasets"


def has(py):
    return os.path.exists(py) and subprocess.run([py, "-c", PROBE], capture_output=True).returncode == 0


def main():
    if has(sys.executable):
        print(sys.executable)
        return
    os.makedirs(CACHE, exist_ok=True)
    with open(VENV + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not has(VENV_PY):
            print(f"installing pyarrow and datasets into {VENV}", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "venv", "--clear", VENV], check=True)
            r = subprocess.run([VENV_PY, "-m", "pip", "install", "-q", "pyarrow", "datasets"])
            if r.returncode != 0 or not has(VENV_PY):
                print("ensure_pyarrow: pip install pyarrow datasets failed", file=sys.stderr)
                sys.exit(1)
    print(VENV_PY)


if __name__ == "__main__":
    main()
