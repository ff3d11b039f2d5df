"""Reads a table's rows as JSON, one object per line: what troupe's `dataset` env runs for
`.parquet` files and Hugging Face `datasets` directories (a `save_to_disk` Dataset or DatasetDict,
or a folder of `.arrow`/`.parquet` files such as the Hub cache holds). Needs only pyarrow.

    python -m troupe_env.read_rows PATH [--split NAME] [--prefer NAME] [--max-rows N] [--out FILE] [--header]

Rows come in the table's order; an error (exit 2, one line on stderr) names the path and row.
"""
import argparse
import glob
import json
import math
import os
import re
import sys


class ReadError(Exception):
    pass


def _pyarrow():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ReadError(
            f"reading parquet files and datasets directories needs pyarrow, which {sys.executable} lacks: "
            f"install it with `{sys.executable} -m pip install pyarrow` (or point config 'python' / "
            "$TROUPE_PYTHON at a Python that has it)")
    return pyarrow


def _split_of_file(name):
    """`gsm8k-train.arrow`, `train-00000-of-00002.parquet` -> `train`."""
    stem = re.sub(r"\.(arrow|parquet)$", "", os.path.basename(name))
    stem = re.sub(r"-\d+-of-\d+$", "", stem)
    return stem.rsplit("-", 1)[-1]


def _dataset_files(folder):
    """The data files of one save_to_disk Dataset folder, in order."""
    state = os.path.join(folder, "state.json")
    if os.path.exists(state):
        with open(state) as f:
            files = [d["filename"] for d in json.load(f).get("_data_files", [])]
        return [os.path.join(folder, x) for x in files]
    return sorted(glob.glob(os.path.join(folder, "*.arrow")))


def splits_of(path):
    """{split name or None (the source has one unnamed split): [data files]}."""
    if not os.path.exists(path):
        raise ReadError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        return {None: [path]}
    dict_file = os.path.join(path, "dataset_dict.json")
    if os.path.exists(dict_file):
        with open(dict_file) as f:
            names = json.load(f).get("splits", [])
        return {n: _dataset_files(os.path.join(path, n)) for n in names}
    if os.path.exists(os.path.join(path, "state.json")):
        return {None: _dataset_files(path)}
    files = sorted(glob.glob(os.path.join(path, "**", "*.arrow"), recursive=True) +
                   glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True))
    if not files:
        raise ReadError(f"{path}: a directory with no dataset_dict.json, state.json, .arrow or .parquet files")
    out = {}
    for f in files:
        out.setdefault(_split_of_file(f), []).append(f)
    return out


def choose(path, splits, split, prefer):
    names = sorted(n for n in splits if n is not None)
    if split:
        if split not in splits:
            if not names:
                raise ReadError(f"{path}: holds one unnamed split, so 'split: {split}' does not apply (remove it)")
            raise ReadError(f"{path}: no split '{split}' (splits: {', '.join(names)})")
        return split
    if len(splits) == 1:
        return next(iter(splits))
    if prefer and prefer in splits:
        return prefer
    raise ReadError(f"{path}: holds several splits ({', '.join(names)}); choose one with config 'split'")


def _tables(files):
    pa = _pyarrow()
    for f in files:
        try:
            if f.endswith(".parquet"):
                yield f, pa.parquet.read_table(f)
                continue
            with pa.memory_map(f) as source:
                try:
                    table = pa.ipc.open_stream(source).read_all()
                except pa.ArrowInvalid:
                    table = pa.ipc.open_file(source).read_all()
            yield f, table
        except (OSError, pa.ArrowException) as e:
            raise ReadError(f"{f}: cannot read: {e}")


def _plain(value):
    """JSON-safe: non-finite floats become null, bytes and other objects their str()."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def write_rows(path, split, prefer, max_rows, out, header=False):
    splits = splits_of(path)
    name = choose(path, splits, split, prefer)
    files = splits[name]
    where = path if name is None else f"{path}[{name}]"
    if header:
        out.write(json.dumps({"source": where}, ensure_ascii=False) + "\n")
    n = 0
    for _, table in _tables(files):
        for batch in table.to_batches():
            for row in batch.to_pylist():
                if max_rows and n >= max_rows:
                    return n
                n += 1
                try:
                    out.write(json.dumps(_plain(row), ensure_ascii=False, allow_nan=False) + "\n")
                except (TypeError, ValueError) as e:
                    raise ReadError(f"{where}:{n}: row cannot be written as JSON: {e}")
    if n == 0:
        raise ReadError(f"{where}: has no rows")
    return n


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--split", default="", help="the split of a DatasetDict or multi-split folder")
    p.add_argument("--prefer", default="", help="the split taken when there are several and --split is not given")
    p.add_argument("--max-rows", type=int, default=0, help="read at most this many rows (0: all)")
    p.add_argument("--out", default="", help="write the rows here (default: stdout)")
    p.add_argument("--header", action="store_true", help='first write {"source": PATH or PATH[SPLIT]}')
    a = p.parse_args(argv)
    try:
        if a.out:
            with open(a.out, "w", encoding="utf-8") as out:
                write_rows(a.path, a.split, a.prefer, a.max_rows, out, a.header)
        else:
            write_rows(a.path, a.split, a.prefer, a.max_rows, sys.stdout, a.header)
    except ReadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
