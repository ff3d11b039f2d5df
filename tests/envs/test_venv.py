"""The one way the env tests get a Python with the packages they need: this Python when it can
import them, else a venv under $TROUPE_CACHE (default ~/.cache/troupe)/NAME, made and pip-installed
once under a file lock (concurrent tests wait for it). Prints that Python's path as the last stdout
line; exits 1 with the reason when pip fails. Used by ensure_reasoning_gym.py and
dataset_files/ensure_pyarrow.py."""
import fcntl
import os
import subprocess
import sys

CACHE = os.environ.get("TROUPE_CACHE", os.path.expanduser("~/.cache/troupe"))


def has(py, probe):
    return os.path.exists(py) and subprocess.run([py, "-c", probe], capture_output=True).returncode == 0


def ensure(name, probe, packages, who):
    """Print a Python for which `probe` (an import line) succeeds; venv NAME gets `packages`."""
    if has(sys.executable, probe):
        print(sys.executable)
        return
    venv = os.path.join(CACHE, name)
    venv_py = os.path.join(venv, "bin", "python")
    os.makedirs(CACHE, exist_ok=True)
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not has(venv_py, probe):
            print(f"installing {' and '.join(packages)} into {venv}", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
            r = subprocess.run([venv_py, "-m", "pip", "install", "-q", *packages])
            if r.returncode != 0 or not has(venv_py, probe):
                print(f"{who}: pip install {' '.join(packages)} failed", file=sys.stderr)
                sys.exit(1)
    print(venv_py)
