#!/usr/bin/env python3
"""Prints the path of a Python that has reasoning-gym and pyzmq (what `type: reasoning_gym` runs):
this Python when it has both, else a venv under $TROUPE_CACHE (default ~/.cache/troupe)/
venv-reasoning-gym, installed on first use (test_venv.py). Exit 1 with the reason when pip fails.
    ensure_reasoning_gym.py       -> last stdout line: that python"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_venv import ensure  # noqa: E402

if __name__ == "__main__":
    ensure("venv-reasoning-gym", "import reasoning_gym, zmq", ["reasoning-gym", "pyzmq"], "ensure_reasoning_gym")
