#!/usr/bin/env python3
"""Prints the path of a Python that has nemo-gym 0.4.x (the last releases that run on Python 3.12),
installing it on first use into a venv under $TROUPE_CACHE (default ~/.cache/troupe)/venv-nemo-gym.
The venv is made from a Python >= 3.12: $TROUPE_NEMO_GYM_BASE_PYTHON, python3.12 on PATH, or
pyenv's 3.12. Exit 1 with the reason when none is found or pip fails.
    ensure_nemo_gym.py            -> last stdout line: the venv's python"""
import fcntl
import glob
import os
import shutil
import subprocess
import sys

CACHE = os.environ.get("TROUPE_CACHE", os.path.expanduser("~/.cache/troupe"))
VENV = os.path.join(CACHE, "venv-nemo-gym")
VENV_PY = os.path.join(VENV, "bin", "python")
SPEC = "nemo-gym>=0.4,<0.5"


def base_python():
    cands = [os.environ.get("TROUPE_NEMO_GYM_BASE_PYTHON", ""), shutil.which("python3.12") or ""]
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    if shutil.which("pyenv"):
        p = subprocess.run(["pyenv", "root"], capture_output=True, text=True)
        if p.returncode == 0:
            root = p.stdout.strip()
    cands += sorted(glob.glob(os.path.join(root, "versions", "3.12*", "bin", "python")), reverse=True)
    # (a pyenv shim for python3.12 exists on PATH even where it refuses to run: try each one)
    for c in cands:
        if c and os.path.exists(c) and subprocess.run(
                [c, "-c", "import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)"],
                capture_output=True).returncode == 0:
            return c
    return None


def usable():
    return os.path.exists(VENV_PY) and subprocess.run(
        [VENV_PY, "-c", "import nemo_gym, resources_servers, uvicorn"], capture_output=True).returncode == 0


def main():
    os.makedirs(CACHE, exist_ok=True)
    with open(VENV + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not usable():
            base = base_python()
            if base is None:
                print("ensure_nemo_gym: no Python 3.12 found (nemo-gym 0.4 needs >= 3.12): set "
                      "TROUPE_NEMO_GYM_BASE_PYTHON or install one with pyenv", file=sys.stderr)
                sys.exit(1)
            print(f"installing {SPEC} into {VENV} (from {base})", file=sys.stderr, flush=True)
            subprocess.run([base, "-m", "venv", "--clear", VENV], check=True)
            r = subprocess.run([VENV_PY, "-m", "pip", "install", "-q", SPEC])
            if r.returncode != 0 or not usable():
                print(f"ensure_nemo_gym: pip install {SPEC} failed", file=sys.stderr)
                sys.exit(1)
    print(VENV_PY)


if __name__ == "__main__":
    main()
