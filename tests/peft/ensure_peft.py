#!/usr/bin/env python3
"""Prints the path of a Python that has peft, transformers and torch (what the LoRA adapter tests
check troupe's files against): this Python when it has them, else a venv under $TROUPE_CACHE
(default ~/.cache/troupe)/venv-peft, installed on first use (../envs/test_venv.py). Exit 1 with
the reason when pip fails.
    ensure_peft.py       -> last stdout line: that python"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "envs"))
from test_venv import ensure  # noqa: E402

PACKAGES = ["peft==0.21.2", "transformers==5.24.0", "torch==2.15.0", "safetensors==0.8.0"]

if __name__ == "__main__":
    ensure("venv-peft", "import peft, transformers, torch, safetensors", PACKAGES, "ensure_peft")
