#!/usr/bin/env python3
"""Prints the path of a Python that has llama-cpp-python (the llama_cpp baseline of `troupe bench
policy`'s qlora_decode_smollm2_b1 row): this Python when it has it, else a venv under $TROUPE_CACHE
(default ~/.cache/troupe)/venv-llama-cpp, pip-installed on first use (PyPI's sdist builds llama.cpp
for this CPU; tests/envs/test_venv.py). Exit 1 with the reason when pip fails.
    ensure_llama_cpp.py  -> last stdout line: that python"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "envs"))
from test_venv import ensure  # noqa: E402

PACKAGES = ["llama-cpp-python==0.3.36"]

if __name__ == "__main__":
    ensure("venv-llama-cpp", "import llama_cpp", PACKAGES, "ensure_llama_cpp")
