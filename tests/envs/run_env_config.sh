#!/usr/bin/env bash
# envs.config_nemo_gym / envs.config_reasoning_gym: a shortened run of configs/nemo_gym_grpo.yaml or
# configs/reasoning_gym_grpo.yaml (nemo-gym installed on first use by ensure_nemo_gym.py); checks
# that every step and the eval row are written.
#   run_env_config.sh TROUPE PYTHON SOURCE_DIR WORK_DIR nemo_gym|reasoning_gym
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 WORK=$4 WHICH=$5
rm -rf "$WORK" && mkdir -p "$WORK"
if [ "$WHICH" = nemo_gym ]; then
  "$PY" "$SRC/tests/envs/ensure_nemo_gym.py" > /dev/null
  SETS=(--set grpo.max_steps=2)
  EXPECT='"eval_env/counter/mean/reward"'
else
  SETS=(--set grpo.max_steps=2 --set sft.max_steps=2 --set eval.every=0 --set eval.num_prompts=8)
  EXPECT='"eval_accuracy/arith"'
fi
"$TROUPE" run "$SRC/configs/${WHICH}_grpo.yaml" --set run.dir="$WORK/run" --set logger.progress=off "${SETS[@]}"
"$PY" - "$WORK/run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r["step"] for r in rows if r.get("phase") == "grpo" and "reward_mean" in r]
assert len(steps) == 2, steps
PY
grep -q "$EXPECT" "$WORK/run/metrics.jsonl"
echo "$WHICH config: ok"
