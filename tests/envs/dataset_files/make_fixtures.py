#!/usr/bin/env python3
"""Writes the dataset_files tests' fixtures into OUT from one list of rows (needs pyarrow and
datasets): rows.jsonl, rows.parquet, a save_to_disk Dataset (saved/), a save_to_disk DatasetDict
(dict/, splits train and test), a Hub-cache-like folder (hub/: name-train.arrow, name-test.arrow),
and the bad ones: no_answer.parquet (no answer column), null_answer.parquet (row 3's answer is
null), empty.parquet, garbage.parquet.
    make_fixtures.py OUT"""
import json
import os
import sys

import datasets
import pyarrow as pa
import pyarrow.parquet as pq


def rows(n, tag):
    return [{"question": f"{tag} question {i}: {i} + {i} = ? \u00e9", "answer": str(2 * i),
             "numbers": [i, i + 1], "level": i % 3} for i in range(n)]


def main(out):
    os.makedirs(out, exist_ok=True)
    train, test = rows(12, "train"), rows(5, "test")
    with open(os.path.join(out, "rows.jsonl"), "w", encoding="utf-8") as f:
        for r in train:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(os.path.join(out, "test.jsonl"), "w", encoding="utf-8") as f:
        for r in test:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    pq.write_table(pa.Table.from_pylist(train), os.path.join(out, "rows.parquet"))
    datasets.Dataset.from_list(train).save_to_disk(os.path.join(out, "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(train),
                          "test": datasets.Dataset.from_list(test)}).save_to_disk(os.path.join(out, "dict"))
    hub = os.path.join(out, "hub")
    os.makedirs(hub, exist_ok=True)
    for name, split in (("train", train), ("test", test)):
        table = pa.Table.from_pylist(split)
        with pa.OSFile(os.path.join(hub, f"mydata-{name}.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
    no_answer = [{k: v for k, v in r.items() if k != "answer"} for r in train[:5]]
    pq.write_table(pa.Table.from_pylist(no_answer), os.path.join(out, "no_answer.parquet"))
    null_answer = [dict(r) for r in train[:5]]
    null_answer[2]["answer"] = None
    pq.write_table(pa.Table.from_pylist(null_answer), os.path.join(out, "null_answer.parquet"))
    pq.write_table(pa.Table.from_pylist(train).slice(0, 0), os.path.join(out, "empty.parquet"))
    with open(os.path.join(out, "garbage.parquet"), "wb") as f:
        f.write(b"this is not a parquet file\n")


if __name__ == "__main__":
    main(sys.argv[1])
