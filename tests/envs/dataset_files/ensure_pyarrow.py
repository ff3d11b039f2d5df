#!/usr/bin/env python3
"""Prints the path of a Python that has pyarrow and datasets (what the dataset_files tests write
their parquet and save_to_disk fixtures with, and what troupe's row reader runs): this Python when
it has both, else a venv under $TROUPE_CACHE (default ~/.cache/troupe)/venv-datasets, installed on
first use (../test_venv.py). Exit 1 with the reason when pip fails.
    ensure_pyarrow.py       -> last stdout line: that python"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_venv import ensure  # noqa: E402

if __name__ == "__main__":
    ensure("venv-datasets", "import pyarrow, datasets", ["pyarrow", "datasets"], "ensure_pyarrow")
