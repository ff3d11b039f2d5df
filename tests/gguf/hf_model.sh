#!/usr/bin/env bash
# e2e.hf_model: configs/hf_model.yaml as its header says to use it: the real SmolLM2-135M-Instruct
# GGUF (fetched on first use) becomes a Hugging Face directory through `troupe import`, and the config
# trains 2 GRPO steps from that directory (policy.path), with the directory's chat template and an
# eval before and after. Also: the quickstart with policy.path added is refused with one error naming
# the policy.model section.
# Usage: hf_model.sh TROUPE PYTHON SRC_DIR WORK_DIR
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 W=$4
rm -rf "$W" && mkdir -p "$W"
GGUF="$(bash "$SRC/tests/gguf/fetch_smollm2.sh" "$PY")"
"$TROUPE" import "$GGUF" "$W/SmolLM2-135M-Instruct"
"$TROUPE" run "$SRC/configs/hf_model.yaml" --set run.dir="$W/run" --set policy.path="$W/SmolLM2-135M-Instruct" \
  --set grpo.max_steps=2 --set rollout.prompts_per_step=2 --set rollout.num_generations=4 \
  --set rollout.max_response_length=16 --set eval.num_prompts=4 --set logger.progress=plain
"$PY" "$SRC/tests/e2e/check_run.py" steps "$W/run" 2
"$PY" "$SRC/tests/e2e/check_run.py" files "$W/run"
"$PY" - "$W/run" <<'PY'
import glob, json, os, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
assert [r["step"] for r in rows if "eval_accuracy" in r] == [0, 2], rows
trajs = [json.loads(l) for f in sorted(glob.glob(os.path.join(run, "trajectories", "*.jsonl"))) for l in open(f)]
assert trajs and trajs[0]["turns"][0]["prompt_tokens"][:2] == [1, 9690], "prompts use the directory's ChatML template"
PY
set +e
"$TROUPE" validate "$SRC/configs/quickstart.yaml" --set policy.path="$W/SmolLM2-135M-Instruct" > "$W/refused.txt" 2>&1
rc=$?
set -e
cat "$W/refused.txt"
[[ $rc -eq 2 ]] || { echo "expected exit 2, got $rc"; exit 1; }
[[ $(grep -c "error:" "$W/refused.txt") -eq 1 ]] || { echo "expected one error for the policy.model section"; exit 1; }
grep -q "remove the policy.model section (family, vocab_size," "$W/refused.txt"
echo "hf_model: ok"
