#!/usr/bin/env bash
# envs.judge_serve_run (slow): a whole run whose judge is a real model behind `troupe serve`: the
# test starts `troupe serve` on the SmolLM2-135M-Instruct GGUF (tests/gguf/fetch_smollm2.sh) on
# 127.0.0.1 with an API key, and configs/python_reward.yaml's tiny policy trains 2 steps with its
# dataset env scored by that judge only (type: judge, url: the server, api_key_env). Every step row
# carries reward/judge, judge/parse_fail_frac and judge/latency_s; the server saw the key.
#   judge_serve_run.sh TROUPE PYTHON SOURCE_DIR WORK_DIR
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 WORK=$4
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
GGUF=$(bash "$SRC/tests/gguf/fetch_smollm2.sh" "$PY") || { echo "SKIP: no SmolLM2 GGUF"; exit 77; }
export JUDGE_KEY=sekret-judge-key
TROUPE_API_KEY=$JUDGE_KEY "$TROUPE" serve "$GGUF" --bind 127.0.0.1:0 --model-name smol-judge --max-batch 8 \
  --max-context 512 --threads 1 > "$WORK/serve.out" 2> "$WORK/serve.err" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
PORT=""
for _ in $(seq 600); do
  PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$WORK/serve.out")
  [ -n "$PORT" ] && break
  kill -0 $SERVER 2>/dev/null || { cat "$WORK/serve.err"; echo "FAIL: troupe serve exited"; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { cat "$WORK/serve.err"; echo "FAIL: troupe serve did not start"; exit 1; }
grep -q "API key required" "$WORK/serve.out"
# the judge: the reply's last number 0-10 is the score; a reply without one fails as judge_parse
RUBRIC='Rate the answer {response} to {prompt} from 0 to 10. Reply with one number.'
JUDGE='{"url": "http://127.0.0.1:'"$PORT"'/v1", "model": "smol-judge", "api_key_env": "JUDGE_KEY", "rubric": "'"$RUBRIC"'", "pattern": "([0-9]+)", "range": [0, 1000000], "max_tokens": 8, "timeout_s": 120}'
ROWS='"train": "data/python_reward_train.jsonl", "template": "{question}="'
"$TROUPE" run "$SRC/configs/python_reward.yaml" --set run.dir="$WORK/run" --set sft.enabled=false \
  --set grpo.max_steps=2 --set rollout.prompts_per_step=2 --set rollout.num_generations=4 --set eval.every=0 \
  --set eval.at_start=false --set eval.num_prompts=2 --set envs[0].max_retries=0 --set envs[0].timeout_s=300 \
  --set checkpointing.enabled=false --set logger.tensorboard=false --set logger.progress=plain \
  --set envs[0].type=judge --set "envs[0].config={$ROWS, \"judge\": $JUDGE}" --set envs[0].max_failure_frac=1 \
  > "$WORK/run.out" 2> "$WORK/run.err" || { tail -n 30 "$WORK/run.err"; echo "FAIL: the run"; exit 1; }
"$PY" - "$WORK/run" << 'PYEOF'
import json, os, sys
rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], "metrics.jsonl")) if l.strip()]
grpo = [r for r in rows if r.get("phase") == "grpo" and "reward_mean" in r]
assert len(grpo) == 2, grpo
for r in grpo:
    for k in ("reward/judge", "judge/parse_fail_frac", "judge/latency_s"):
        assert k in r, f"step {r['step']}: no {k} in {sorted(r)}"
    assert 0 <= r["judge/parse_fail_frac"] < 1 and r["judge/latency_s"] > 0, r
    print("step", r["step"], "reward/judge", r["reward/judge"], "judge/parse_fail_frac", r["judge/parse_fail_frac"],
          "judge/latency_s", round(r["judge/latency_s"], 3))
PYEOF
echo "judge_serve_run: ok"
