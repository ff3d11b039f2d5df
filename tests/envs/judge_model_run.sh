#!/usr/bin/env bash
# envs.judge_model_run: whole runs of configs/python_reward.yaml's tiny model with its dataset env
# scored by a judge with a local model (`envs[].config.judge.model`, no url) on one scorer: the digit
# judge (digit_judge.h, made by make_digit_judge), whose greedy verdict is the response's last
# character when it is a digit, else 0. Each step row carries reward/judge, judge/parse_fail_frac,
# judge/latency_s and the scorer requests' scorer/judge/*, also in TensorBoard and troupe report;
# each completion's reward is its parsed verdict; a verdict the pattern cannot parse fails its
# episode as judge_parse, retried and counted. An async run (rollout.async, max_staleness 1)
# checkpointed at step 2 and resumed to step 4 logs what an uninterrupted one does: every non-timing
# value bit for bit, and the same keys in every row (scorer/judge/* and judge/latency_s included:
# the checkpoint's finished rollouts keep them).
#   judge_model_run.sh TROUPE PYTHON SOURCE_DIR WORK_DIR MAKE_DIGIT_JUDGE
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 WORK=$4 MAKE_JUDGE=$5
CHECK="$PY $SRC/tests/e2e/check_run.py"
CFG="$SRC/configs/python_reward.yaml"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
"$MAKE_JUDGE" "$WORK/judge" > /dev/null
ROWS='"train": "data/python_reward_train.jsonl", "template": "{question}="'
JUDGE='{"model": "'"$WORK/judge"'", "rubric": "Score {prompt}{response}", "pattern": "([0-9])", "range": [0, 10], "max_tokens": 2, "timeout_s": 60}'
SHORT=(--set sft.enabled=false --set rollout.prompts_per_step=8 --set eval.every=0 --set logger.progress=plain
       --set logger.trajectories_per_step=64 --set cluster.scorers=1 --set envs[0].type=judge
       --set "envs[0].config={$ROWS, \"judge\": $JUDGE}")
run() {  # run NAME ARGS...: troupe run with ARGS in $WORK/NAME, must exit 0
  local name=$1 rc=0
  shift
  "$TROUPE" run "$CFG" "${SHORT[@]}" --set run.dir="$WORK/$name" "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" || rc=$?
  if [ "$rc" != 0 ]; then
    tail -n 20 "$WORK/$name.out" "$WORK/$name.err"
    echo "FAIL: $name: exit $rc"
    exit 1
  fi
}

# 1. a sync run: the judge metrics in every step row, the reward the parsed verdict
run sync --set grpo.max_steps=3 --set checkpointing.enabled=false
"$TROUPE" report "$WORK/sync" > /dev/null  # the frozen models' panel: judge/parse_fail_frac, scorer/judge/latency_s
test -s "$WORK/sync/report.png"
$PY - "$WORK/sync" << 'PYEOF'
import glob, json, os, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
grpo = [r for r in rows if r.get("phase") == "grpo" and "reward_mean" in r]
assert len(grpo) == 3, grpo
for r in grpo:
    for k in ("reward/judge", "judge/parse_fail_frac", "judge/latency_s", "scorer/judge/latency_s",
              "scorer/judge/latency_max_s", "scorer/judge/batch_requests", "scorer/judge/batch_requests_max"):
        assert k in r, f"step {r['step']}: no {k} in {sorted(r)}"
    assert r["judge/parse_fail_frac"] == 0 and r["env_failures"] == 0, r
    assert abs(r["reward/judge"] - r["reward_mean/sums"]) < 1e-9, r  # the judge is the whole reward
    lat, top = r["scorer/judge/latency_s"], r["scorer/judge/latency_max_s"]
    assert 0 < lat <= top < 60 and 0 < r["judge/latency_s"] < 60, r
    assert 1 <= r["scorer/judge/batch_requests"] <= r["scorer/judge/batch_requests_max"] <= 64, r
trajs = [json.loads(l) for p in sorted(glob.glob(os.path.join(run, "trajectories", "*.jsonl"))) for l in open(p) if l.strip()]
assert len(trajs) == 3 * 64, len(trajs)
digits = 0
for t in trajs:
    text = t["turns"][-1]["completion"]
    verdict = int(text[-1]) if text and text[-1].isdigit() else 0
    digits += verdict > 0
    assert t["reward_components"] == {"judge": verdict / 10}, (text, t["reward_components"])
    assert t["reward"] == verdict / 10, (text, t["reward"])
assert digits > 0, "no response ended in a digit 1-9: the verdicts did not vary"
for r in grpo:
    xs = [t["reward"] for t in trajs if t["step"] == r["step"]]
    assert abs(r["reward/judge"] - sum(xs) / len(xs)) < 1e-9, (r["step"], r["reward/judge"])
print("sync: ok,", len(trajs), "trajectories,", digits, "verdicts above 0")
PYEOF
# TensorBoard has the judge's scalars under grpo/
$PY - "$WORK/sync" << 'PYEOF'
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
files = glob.glob(sys.argv[1] + "/tb/events.out.tfevents.*")
assert len(files) == 1, files
acc = EventAccumulator(files[0])
acc.Reload()
tags = acc.Tags()["scalars"]
for t in ("grpo/reward/judge", "grpo/judge/parse_fail_frac", "grpo/judge/latency_s", "grpo/scorer/judge/latency_s",
          "grpo/scorer/judge/batch_requests"):
    assert t in tags and len(acc.Scalars(t)) == 3, (t, sorted(tags))
print("tensorboard: ok")
PYEOF

# 1b. a pattern the verdict of a response ending in 1-9 cannot match ("dd" against "(0)"): those
# episodes fail as judge_parse (retried on the next env worker, counted), the others score 0
run unparsed --set grpo.max_steps=2 --set checkpointing.enabled=false --set logger.tensorboard=false \
  --set envs[0].max_failure_frac=1 --set "envs[0].config={$ROWS, \"judge\": ${JUDGE/\(\[0-9\]\)/(0)}}"
$PY - "$WORK/unparsed" << 'PYEOF'
import glob, json, os, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
grpo = [r for r in rows if r.get("phase") == "grpo" and "reward_mean" in r]
trajs = [json.loads(l) for p in sorted(glob.glob(os.path.join(run, "trajectories", "*.jsonl"))) for l in open(p) if l.strip()]
assert len(grpo) == 2 and len(trajs) == 2 * 64, (len(grpo), len(trajs))
failed = 0
for r in grpo:
    xs = [t for t in trajs if t["step"] == r["step"]]
    bad = [t for t in xs if t["turns"][-1]["completion"][-1:] in "123456789" and t["turns"][-1]["completion"]]
    for t in xs:
        assert (t["termination"] == "judge_parse") == (t in bad) and t["reward"] == 0, (
            t["turns"][-1]["completion"], t["termination"], t["reward"])
    assert r.get("env_failures/judge_parse", 0) == len(bad), (r["step"], r.get("env_failures/judge_parse"), len(bad))
    assert r["judge/parse_fail_frac"] == len(bad) / 64, (r["step"], r["judge/parse_fail_frac"], len(bad))
    if bad:
        assert r["env_retries"] >= len(bad), r  # each failed verify was retried
    failed += len(bad)
assert failed > 0, "no response ended in 1-9: nothing failed to parse"
print("unparsed: ok,", failed, "episodes failed as judge_parse")
PYEOF

# 2. async: 4 steps at once, and 2 steps then --resume to 4 (checkpoint every 2): the same rows
A=(--set rollout.async=true --set rollout.max_staleness=1 --set optimizer.schedule=constant
   --set checkpointing.every=2 --set logger.tensorboard=false)
run async "${A[@]}" --set grpo.max_steps=4
run resumed "${A[@]}" --set grpo.max_steps=2
"$TROUPE" run "$CFG" --resume "$WORK/resumed" "${SHORT[@]}" "${A[@]}" --set grpo.max_steps=4 \
  > "$WORK/resumed2.out" 2> "$WORK/resumed2.err" || { tail -n 20 "$WORK/resumed2.err"; echo "FAIL: resume"; exit 1; }
grep -q "finished before the checkpoint, train first" "$WORK/resumed2.err" "$WORK/resumed2.out"
$CHECK same "$WORK/async" "$WORK/resumed"
$CHECK same_keys "$WORK/async" "$WORK/resumed"
echo "judge_model_run: all cases passed"
