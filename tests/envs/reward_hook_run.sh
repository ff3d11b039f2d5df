#!/usr/bin/env bash
# envs.reward_hook_run: whole runs of configs/python_reward.yaml (the dataset env, `verifier: python`),
# shortened, from another working directory: it trains, logs reward/*, records the
# components in trajectories; a hook that raises or exits for some rows has those episodes counted
# as reward_error / reward_crash and the run goes on; a missing function is exit 2 naming it; a
# remote env's relative config path arrives resolved against the YAML's folder.
#   reward_hook_run.sh TROUPE PYTHON SOURCE_DIR WORK_DIR
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 WORK=$4
CHECK="$PY $SRC/tests/reliability/check.py"
CFG="$SRC/configs/python_reward.yaml"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"  # not the YAML's folder: relative paths must still start there
SHORT=(--set sft.max_steps=5 --set grpo.max_steps=3 --set rollout.prompts_per_step=8 --set eval.every=0
       --set checkpointing.enabled=false --set logger.tensorboard=false --set logger.progress=plain
       --set logger.trajectories_per_step=64)
expect_exit() {  # expect_exit CODE NAME ARGS...: troupe run with ARGS, in $WORK/NAME, must exit CODE
  local want=$1 name=$2 rc=0
  shift 2
  "$TROUPE" run "$@" --set run.dir="$WORK/$name" "${SHORT[@]}" > "$WORK/$name.out" 2> "$WORK/$name.err" || rc=$?
  if [ "$rc" != "$want" ]; then
    tail -n 20 "$WORK/$name.out" "$WORK/$name.err"
    echo "FAIL: $name: expected exit $want, got $rc"
    exit 1
  fi
}

# 1. trains with the hook; components logged and recorded
expect_exit 0 ok "$CFG"
$CHECK none "$WORK/ok" env_failures
$PY - "$WORK/ok" << 'PYEOF'
import glob, json, os, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
grpo = [r for r in rows if r.get("phase") == "grpo" and "reward_mean" in r]
assert len(grpo) == 3 and all(r["groups_generated"] == 8 for r in grpo), grpo
assert any(r.get("phase") == "sft" for r in rows), "no SFT rows (the rows' completion field)"
for r in grpo:
    for k in ("reward/correct", "reward/format"):
        assert k in r, f"step {r['step']}: no {k} in {sorted(r)}"
    # the reward is the components' sum: correct (1) or format (0.1), per completion
    total = r["reward/correct"] + r["reward/format"]
    assert abs(total - r["reward_mean/sums"]) < 1e-9, (total, r["reward_mean/sums"])
trajs = [json.loads(l) for p in glob.glob(os.path.join(run, "trajectories", "*.jsonl")) for l in open(p) if l.strip()]
assert trajs and all(set(t["reward_components"]) == {"correct", "format"} for t in trajs), trajs[0]
print("ok:", len(grpo), "steps,", len(trajs), "trajectories")
PYEOF

# 2. a hook that raises for some rows and exits for others: counted per reason, the run goes on
cat > "$WORK/flaky.py" << 'PYEOF'
import os
def score(prompt, response, reference, row):
    if reference % 4 == 0:
        raise ValueError(f"no reward for row {row['question']}")
    if reference % 4 == 1:
        os._exit(3)
    return 1.0
PYEOF
CONF='{"train": "data/python_reward_train.jsonl", "template": "{question}=", "verifier": "python", "reward": "'$WORK'/flaky.py:score"}'
expect_exit 0 flaky "$CFG" --set "envs[0].config=$CONF" --set envs[0].max_retries=0 --set envs[0].max_failure_frac=1
$CHECK atleast "$WORK/flaky" env_failures/reward_error 1
$CHECK atleast "$WORK/flaky" env_failures/reward_crash 1
$CHECK termination "$WORK/flaky" reward_error
$CHECK termination "$WORK/flaky" reward_crash

# 3. a function that is not there: exit 2 at start, naming it and the file
expect_exit 2 missing "$CFG" --set envs[0].config.reward=python_reward.py:nope
grep -q "no function 'nope'" "$WORK/missing.err"
grep -q "configs/python_reward.py" "$WORK/missing.err"

# 4. a remote env's relative config path starts at the YAML's folder ($WORK/cfg; run from $WORK)
mkdir -p "$WORK/cfg/data"
cp "$SRC/configs/data/python_reward_train.jsonl" "$WORK/cfg/data/rows.jsonl"
$PY - "$CFG" "$WORK/cfg/remote.yaml" "$PY" "$SRC/tests/envs/config_path_env.py" << 'PYEOF'
import sys
text = open(sys.argv[1]).read()
start, end = text.index("envs:\n"), text.index("rollout:\n")
env = ("envs:\n  - name: rows\n    type: remote\n"
       f"    command: [{sys.argv[3]}, {sys.argv[4]}]\n    config: {{data: data/rows.jsonl}}\n")
open(sys.argv[2], "w").write(text[:start] + env + text[end:])
PYEOF
expect_exit 0 remote "$WORK/cfg/remote.yaml" --set sft.enabled=false
$CHECK none "$WORK/remote" env_failures
echo "reward_hook_run: all cases passed"
