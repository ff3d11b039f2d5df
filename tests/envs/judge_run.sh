#!/usr/bin/env bash
# envs.judge_run: whole runs of configs/python_reward.yaml's tiny model with its dataset env scored
# by an LLM judge (tests/envs/fake_judge_server.py, a scripted OpenAI-compatible server with an API
# key): `type: judge` trains and logs reward/judge, judge/latency_s and judge/parse_fail_frac; a
# judge whose replies sometimes hold no score has those episodes counted as judge_parse, one that
# sometimes hangs has them counted as judge_timeout; a verifier
# and a judge together are weighted components; bad judge keys stop the start (exit 2) naming them.
#   judge_run.sh TROUPE PYTHON SOURCE_DIR WORK_DIR
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 WORK=$4
CHECK="$PY $SRC/tests/reliability/check.py"
CFG="$SRC/configs/python_reward.yaml"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
export JUDGE_KEY=sekret-judge-key
"$PY" "$SRC/tests/envs/fake_judge_server.py" "$WORK/port" > "$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -f "$WORK/port" ] && break; sleep 0.1; done
URL="http://127.0.0.1:$(cat "$WORK/port")/v1"
SHORT=(--set sft.enabled=false --set grpo.max_steps=3 --set rollout.prompts_per_step=8 --set eval.every=0
       --set checkpointing.enabled=false --set logger.tensorboard=false --set logger.progress=plain
       --set logger.trajectories_per_step=64)
expect_exit() {  # expect_exit CODE NAME ARGS...: troupe run with ARGS, in $WORK/NAME, must exit CODE
  local want=$1 name=$2 rc=0
  shift 2
  "$TROUPE" run "$CFG" "${SHORT[@]}" "$@" --set run.dir="$WORK/$name" > "$WORK/$name.out" 2> "$WORK/$name.err" || rc=$?
  if [ "$rc" != "$want" ]; then
    tail -n 20 "$WORK/$name.out" "$WORK/$name.err"
    echo "FAIL: $name: expected exit $want, got $rc"
    exit 1
  fi
}
judge() {  # judge RUBRIC [EXTRA JSON KEYS]: the judge mapping as JSON
  echo '{"url": "'"$URL"'", "model": "fake-judge", "api_key_env": "JUDGE_KEY", "rubric": "'"$1"'", "range": [0, 10]'"${2:-}"'}'
}
ROWS='"train": "data/python_reward_train.jsonl", "template": "{question}="'

# 1. type: judge, the judge alone: trains, reward/judge and the judge metrics in every step row
expect_exit 0 only --set envs[0].type=judge --set "envs[0].config={$ROWS, \"judge\": $(judge 'R:{response}')}"
$CHECK none "$WORK/only" env_failures
$PY - "$WORK/only" << 'PYEOF'
import glob, json, os, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
grpo = [r for r in rows if r.get("phase") == "grpo" and "reward_mean" in r]
assert len(grpo) == 3, grpo
for r in grpo:
    for k in ("reward/judge", "judge/parse_fail_frac", "judge/latency_s"):
        assert k in r, f"step {r['step']}: no {k} in {sorted(r)}"
    assert abs(r["reward/judge"] - r["reward_mean/sums"]) < 1e-9, r  # the judge is the whole reward
    assert r["judge/parse_fail_frac"] == 0 and r["judge/latency_s"] > 0, r
trajs = [json.loads(l) for p in glob.glob(os.path.join(run, "trajectories", "*.jsonl")) for l in open(p) if l.strip()]
assert trajs and all(set(t["reward_components"]) == {"judge"} for t in trajs), trajs[0]["reward_components"]
print("only: ok,", len(trajs), "trajectories")
PYEOF

# 2. a judge that sometimes answers without a score: those episodes fail as judge_parse, counted
expect_exit 0 garbage --set envs[0].type=judge --set "envs[0].config={$ROWS, \"judge\": $(judge 'G:{response}')}" \
  --set envs[0].max_failure_frac=1
$CHECK atleast "$WORK/garbage" env_failures/judge_parse 1
$CHECK termination "$WORK/garbage" judge_parse
$PY - "$WORK/garbage" << 'PYEOF'
import json, os, sys
rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], "metrics.jsonl")) if l.strip()]
grpo = [r for r in rows if r.get("phase") == "grpo" and "reward_mean" in r]
for r in grpo:
    frac = r.get("env_failures/judge_parse", 0) / (8 * 8)  # prompts_per_step x num_generations
    assert abs(r["judge/parse_fail_frac"] - frac) < 1e-9, r
assert any(r["judge/parse_fail_frac"] > 0 for r in grpo), grpo
print("garbage: ok")
PYEOF

# 2b. a judge that hangs on some responses: those episodes fail as judge_timeout once timeout_s
# passes, retried and counted, and the run goes on
expect_exit 0 hang --set envs[0].type=judge --set envs[0].max_failure_frac=1 --set envs[0].max_retries=1 \
  --set grpo.max_steps=1 --set rollout.prompts_per_step=4 --set eval.num_prompts=8 \
  --set "envs[0].config={$ROWS, \"judge\": $(judge 'H:{response}' ', "timeout_s": 0.5')}"
$CHECK atleast "$WORK/hang" env_failures/judge_timeout 1
$CHECK termination "$WORK/hang" judge_timeout
grep -q '"env_retries"' "$WORK/hang/metrics.jsonl"

# 3. a verifier and a judge: two weighted components, the reward their weighted sum
expect_exit 0 both --set "envs[0].config={$ROWS, \"verifier\": \"numeric\", \"extract\": \"last_number\", \"judge\": $(judge 'R:{response}'), \"reward_weights\": {\"verifier\": 1, \"judge\": 0.5}}"
$CHECK none "$WORK/both" env_failures
$PY - "$WORK/both" << 'PYEOF'
import json, os, sys
rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], "metrics.jsonl")) if l.strip()]
grpo = [r for r in rows if r.get("phase") == "grpo" and "reward_mean" in r]
assert len(grpo) == 3
for r in grpo:
    total = r["reward/verifier"] + 0.5 * r["reward/judge"]
    assert abs(total - r["reward_mean/sums"]) < 1e-9, (total, r)
print("both: ok")
PYEOF

# 4. bad judge config: exit 2 at start naming the key
expect_exit 2 badweight --set "envs[0].config={$ROWS, \"judge\": $(judge 'R:{response}'), \"reward_weights\": {\"judgee\": 1}}"
grep -q "reward_weights.judgee names no reward component" "$WORK/badweight.err"
expect_exit 2 badurl --set envs[0].type=judge --set "envs[0].config={$ROWS, \"judge\": {\"url\": \"models/judge.gguf\", \"model\": \"m\"}}"
grep -q "'url' must be an http:// or https:// base URL" "$WORK/badurl.err"
expect_exit 2 badrubric --set envs[0].type=judge --set "envs[0].config={$ROWS, \"judge\": $(judge 'R:{response} {answer}')}"
grep -q "unknown placeholder {answer}" "$WORK/badrubric.err"
# a judge with a local model: troupe validate says how its prompt is rendered (chat template or plain)
for M in "$SRC/tests/reward_model/llama" "$SRC/tests/hf_fixture/llama"; do
  "$TROUPE" validate "$CFG" --set envs[0].type=judge --set "envs[0].config={$ROWS, \"judge\": {\"model\": \"$M\"}}" \
    --set cluster.scorers=1 > "$WORK/validate_local.out"
  grep -q "envs\[0\].config.judge.model $M: " "$WORK/validate_local.out"
done
grep -q "no chat template: the rubric is the plain prompt after BOS" "$WORK/validate_local.out"
echo "judge_run: all cases passed"
