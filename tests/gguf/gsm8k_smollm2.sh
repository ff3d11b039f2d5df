#!/usr/bin/env bash
# e2e.gsm8k_smollm2: configs/gsm8k_smollm2.yaml (raw GSM8K-format rows, `extract: gsm8k`,
# `verifier: math`) shortened to 2 GRPO steps on the real SmolLM2-135M-Instruct GGUF: `troupe validate`
# reads every row, the run completes, the prompts are the rows' questions through the chat template,
# and every reward is one the verifier can give (0, the format reward or 1).
# Usage: gsm8k_smollm2.sh TROUPE PYTHON SRC_DIR WORK_DIR
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 W=$4
rm -rf "$W" && mkdir -p "$W"
GGUF="$(bash "$SRC/tests/gguf/fetch_smollm2.sh" "$PY")"
"$TROUPE" validate "$SRC/configs/gsm8k_smollm2.yaml" --set policy.path="$GGUF"
"$TROUPE" run "$SRC/configs/gsm8k_smollm2.yaml" --set run.dir="$W/run" --set policy.path="$GGUF" \
  --set grpo.max_steps=2 --set rollout.prompts_per_step=2 --set rollout.num_generations=4 \
  --set rollout.max_response_length=24 --set eval.num_prompts=4 --set logger.progress=plain
"$PY" "$SRC/tests/e2e/check_run.py" steps "$W/run" 2
"$PY" "$SRC/tests/e2e/check_run.py" files "$W/run"
"$PY" - "$W/run" <<'PY'
import glob, json, os, sys
run = sys.argv[1]
trajs = [json.loads(l) for f in sorted(glob.glob(os.path.join(run, "trajectories", "*.jsonl"))) for l in open(f)]
assert trajs, "no trajectories written"
for t in trajs:
    assert "#### <number>" in t["prompt"]["text"], t["prompt"]["text"]
    assert t["reward"] in (0.0, 0.1, 1.0), t["reward"]
print("gsm8k run: %d trajectories, rewards %s" % (len(trajs), sorted({t["reward"] for t in trajs})))
PY
