#!/usr/bin/env bash
# envs.dataset_files_run: whole runs of the dataset env with shuffle: true (a parquet train file).
# Every row is drawn once per epoch in the order the trajectories show; 5 steps + --resume + 5 steps
# (the checkpoint inside epoch 1, epoch 2 begun after it) equal 10 uninterrupted steps bit for bit,
# draws included; without shuffle the draws are today's (row seed mod N). `troupe validate` reads
# every row: a bad row exits 2 naming FILE:LINE.
#   run_shuffle.sh TROUPE PYTHON SOURCE_DIR WORK_DIR
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 WORK=$4
rm -rf "$WORK" && mkdir -p "$WORK/data"
APY=$("$PY" "$SRC/tests/envs/dataset_files/ensure_pyarrow.py" | tail -1)
CHECK="$PY $SRC/tests/e2e/check_run.py"
# 20 rows "a+b=" (a sum of two digits each, distinct questions), as JSONL and parquet
"$APY" - "$WORK/data" <<'PY'
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in [(i % 10, i // 10 + 1) for i in range(20)]]
with open(sys.argv[1] + "/train.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
pq.write_table(pa.Table.from_pylist(rows), sys.argv[1] + "/train.parquet")
PY
CFG="$WORK/exp.yaml"
cp "$SRC/configs/quickstart.yaml" "$CFG"
ENV="{train: data/train.parquet, python: $APY, eval_fraction: 0.0, shuffle: true}"
S=(--set envs[0].name=data --set envs[0].env=dataset --set "envs[0].config=$ENV" --set sft.enabled=false --set rollout.prompts_per_step=5
   --set rollout.num_generations=4 --set logger.trajectories_per_step=20 --set optimizer.schedule=constant
   --set eval.every=0 --set eval.num_prompts=4 --set checkpointing.every=5 --set logger.progress=off)
"$TROUPE" run "$CFG" --set run.dir="$WORK/a" --set grpo.max_steps=10 "${S[@]}"
"$TROUPE" run "$CFG" --set run.dir="$WORK/b" --set grpo.max_steps=5 "${S[@]}"
"$TROUPE" run "$CFG" --resume "$WORK/b" --set grpo.max_steps=10 "${S[@]}"
$CHECK same "$WORK/a" "$WORK/b"
# the rows each step drew (group order), from the trajectories: each epoch of 20 draws takes
# every row once, the resumed run draws what the uninterrupted one did
"$PY" - "$WORK/a" "$WORK/b" <<'PY'
import json, sys
def draws(run):
    seen = {}
    for line in open(run + "/trajectories/grpo.jsonl"):
        t = json.loads(line)
        m = t["prompt"]["metadata"]
        seen[(t["step"], t["group"])] = (m["row"], m["epoch"])
    return [seen[k] for k in sorted(seen)]
a, b = draws(sys.argv[1]), draws(sys.argv[2])
assert len(a) == 50, len(a)
assert a == b, "the resumed run drew other rows"
for e in range(2):
    rows = [r for r, ep in a[20 * e:20 * (e + 1)]]
    assert len(set(rows)) == 20, (e, rows)
    assert all(ep == e for _, ep in a[20 * e:20 * (e + 1)]), a
assert a[:20] != a[20:40], "each epoch has its own order"
print("shuffle: every row once per epoch; resumed draws identical")
PY
# without shuffle (the key absent): draws are row seed mod N, as before, and a JSONL and a
# parquet file give the same run
P=(--set envs[0].name=data --set envs[0].env=dataset --set sft.enabled=false --set rollout.prompts_per_step=5 --set grpo.max_steps=3
   --set eval.every=0 --set eval.num_prompts=4 --set checkpointing.enabled=false --set logger.progress=off)
"$TROUPE" run "$CFG" --set run.dir="$WORK/j" --set "envs[0].config={train: data/train.jsonl, eval_fraction: 0.0}" "${P[@]}"
"$TROUPE" run "$CFG" --set run.dir="$WORK/p" --set "envs[0].config={train: data/train.parquet, python: $APY, eval_fraction: 0.0}" "${P[@]}"
$CHECK same "$WORK/j" "$WORK/p"
# troupe validate reads every row: a bad one is named (exit 2), a good file passes
"$TROUPE" validate "$CFG" --set envs[0].name=data --set envs[0].env=dataset --set "envs[0].config=$ENV"
printf '{"question": "1+1=", "answer": "2"}\n{"question": "2+2="}\n' > "$WORK/data/bad.jsonl"
rc=0
"$TROUPE" validate "$CFG" --set envs[0].name=data --set envs[0].env=dataset --set "envs[0].config={train: data/bad.jsonl}" 2> "$WORK/err.txt" || rc=$?
cat "$WORK/err.txt"
test $rc -eq 2
grep -q "$WORK/data/bad.jsonl:2: error: row has no answer field 'answer'" "$WORK/err.txt"
echo "dataset files run: ok"
