#!/usr/bin/env bash
# envs.dataset_files_run: whole runs of the dataset env with shuffle: true (a parquet train file).
# Every row is drawn once per epoch in the order the trajectories show; 5 steps + --resume + 5 steps
# (the checkpoint inside epoch 1, epoch 2 begun after it) equal 10 uninterrupted steps bit for bit,
# draws included (sync; async with SFT; with retried resets); without shuffle the draws are
# today's (row seed mod N). `troupe validate` reads every row: a bad row exits 2 naming FILE:LINE.
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
with open(sys.argv[1] + "/eval.jsonl", "w") as f:  # held out: questions the train rows do not have
    f.writelines(json.dumps({"question": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a, b in [(3, 7), (5, 9), (8, 8)])
PY
CFG="$WORK/exp.yaml"
cp "$SRC/configs/quickstart.yaml" "$CFG"
ENV="{train: data/train.parquet, eval: data/eval.jsonl, python: $APY, shuffle: true}"
S=(--set envs[0].name=data --set envs[0].env=dataset --set "envs[0].config=$ENV" --set rollout.prompts_per_step=5
   --set rollout.num_generations=4 --set logger.trajectories_per_step=20 --set optimizer.schedule=constant
   --set eval.every=0 --set eval.num_prompts=4 --set checkpointing.every=5 --set logger.progress=off)
# draws RUN: the (row, epoch) each GRPO group drew, in (step, group) order, from the trajectories
draws() {
  "$PY" - "$1" <<'PY'
import json, sys
seen = {}
for line in open(sys.argv[1] + "/trajectories/grpo.jsonl"):
    t = json.loads(line)
    m = t["prompt"]["metadata"]
    seen[(t["step"], t["group"])] = (m["row"], m["epoch"])
print(json.dumps([seen[k] for k in sorted(seen)]))
PY
}
# resumed NAME CONFIG SETS...: 10 steps, and 5 + --resume + 5, give the same metrics and draws
resumed() {
  local name=$1 cfg=$2
  shift 2
  "$TROUPE" run "$cfg" --set run.dir="$WORK/$name-a" --set grpo.max_steps=10 "${S[@]}" "$@"
  "$TROUPE" run "$cfg" --set run.dir="$WORK/$name-b" --set grpo.max_steps=5 "${S[@]}" "$@"
  "$TROUPE" run "$cfg" --resume "$WORK/$name-b" --set grpo.max_steps=10 "${S[@]}" "$@"
  $CHECK same "$WORK/$name-a" "$WORK/$name-b"
  draws "$WORK/$name-a" > "$WORK/$name-a.draws"
  draws "$WORK/$name-b" > "$WORK/$name-b.draws"
  cmp "$WORK/$name-a.draws" "$WORK/$name-b.draws"
}
resumed sync "$CFG" --set sft.enabled=false
# each epoch of 20 draws takes every row once, each in its own order
"$PY" - "$WORK/sync-a.draws" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
assert len(a) == 50, len(a)
for e in range(2):
    assert len({r for r, _ in a[20 * e:20 * (e + 1)]}) == 20, (e, a)
    assert all(ep == e for _, ep in a[20 * e:20 * (e + 1)]), a
assert [r for r, _ in a[:20]] != [r for r, _ in a[20:40]], "each epoch has its own order"
print("shuffle: every row once per epoch; resumed draws identical")
PY
# the metric data/epoch/<env>: the latest epoch each step drew from (steps 0-3 epoch 0, 4-7 epoch 1, ...)
"$PY" - "$WORK/sync-a/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
epochs = [r["data/epoch/data"] for r in rows if r.get("phase") == "grpo" and "reward_mean" in r]
assert epochs == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2], epochs
PY
# async with SFT examples drawn first (a checkpoint keeps rollouts made ahead, with their draws),
# and retried resets (injected reset faults: each retry draws the next row)
cp "$SRC/configs/async.yaml" "$WORK/async.yaml"
resumed async "$WORK/async.yaml" --set sft.max_steps=2 --set sft.batch_size=6
resumed faults "$CFG" --set sft.enabled=false --set faults.env_exception=0.15 --set faults.env_op=reset --set faults.seed=3
grep -q '"env_retries"' "$WORK/faults-a/metrics.jsonl"
# without shuffle (the key absent): draws are row seed mod N, as before, and a JSONL and a
# parquet file give the same run
P=(--set envs[0].name=data --set envs[0].env=dataset --set sft.enabled=false --set rollout.prompts_per_step=5 --set grpo.max_steps=3
   --set eval.every=0 --set eval.num_prompts=4 --set checkpointing.enabled=false --set logger.progress=off)
"$TROUPE" run "$CFG" --set run.dir="$WORK/j" --set "envs[0].config={train: data/train.jsonl, eval: data/eval.jsonl}" "${P[@]}"
"$TROUPE" run "$CFG" --set run.dir="$WORK/p" --set "envs[0].config={train: data/train.parquet, eval: data/eval.jsonl, python: $APY}" "${P[@]}"
$CHECK same "$WORK/j" "$WORK/p"
# troupe validate reads every row: a bad one is named (exit 2), a good file passes
"$TROUPE" validate "$CFG" --set envs[0].name=data --set envs[0].env=dataset --set "envs[0].config=$ENV"
printf '{"question": "1+1=", "answer": "2"}\n{"question": "2+2="}\n' > "$WORK/data/bad.jsonl"
rc=0
"$TROUPE" validate "$CFG" --set envs[0].name=data --set envs[0].env=dataset --set "envs[0].config={train: data/bad.jsonl}" 2> "$WORK/err.txt" || rc=$?
cat "$WORK/err.txt"
test $rc -eq 2
grep -q "$WORK/data/bad.jsonl:2: error: row has no answer field 'answer'" "$WORK/err.txt"
# ... and a dataset env without held-out rows (no eval file, eval_fraction 0) is refused, naming why
rc=0
"$TROUPE" validate "$CFG" --set envs[0].name=data --set envs[0].env=dataset \
  --set "envs[0].config={train: data/train.jsonl, eval_fraction: 0.0}" 2> "$WORK/err.txt" || rc=$?
cat "$WORK/err.txt"
test $rc -eq 2
grep -q "its held-out split cannot be drawn" "$WORK/err.txt"
echo "dataset files run: ok"
