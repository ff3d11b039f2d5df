#!/usr/bin/env bash
# e2e.smollm2_grpo: configs/smollm2_grpo.yaml shortened to 2 GRPO steps on the real SmolLM2-135M-Instruct
# GGUF (fetched on first use): the run completes with every artifact, prompts are rendered with the
# model's own chat template (ChatML, no BOS added), the training rows are steps 1..2, held-out eval
# runs before and after, and the final checkpoint is a model directory that keeps the chat template
# and answers through `troupe generate --messages`.
# Usage: grpo_smollm2.sh TROUPE PYTHON SRC_DIR WORK_DIR
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 W=$4
rm -rf "$W" && mkdir -p "$W"
GGUF="$(bash "$SRC/tests/gguf/fetch_smollm2.sh" "$PY")"
CHECK="$PY $SRC/tests/e2e/check_run.py"
"$TROUPE" run "$SRC/configs/smollm2_grpo.yaml" --set run.dir="$W/run" --set policy.path="$GGUF" \
  --set grpo.max_steps=2 --set rollout.prompts_per_step=2 --set rollout.num_generations=4 \
  --set rollout.max_response_length=16 --set eval.num_prompts=4 --set logger.progress=plain
$CHECK steps "$W/run" 2
$CHECK files "$W/run"
"$PY" - "$W/run" <<'PY'
import glob, json, os, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
evals = [r for r in rows if "eval_accuracy" in r]
assert [r["step"] for r in evals] == [0, 2], [r["step"] for r in evals]   # eval.at_start and at the end
train = [r for r in rows if "eval_accuracy" not in r]
for r in train:
    assert 0.0 <= r["reward_mean"] <= 1.0 and r["grad_norm"] >= 0.0 and r["lr"] > 0, r   # (a step whose groups all scored 0 has no gradient)
trajs = [json.loads(l) for f in sorted(glob.glob(os.path.join(run, "trajectories", "*.jsonl"))) for l in open(f)]
assert trajs, "no trajectories written"
t = trajs[0]
assert t["prompt"]["text"].startswith("What is "), t["prompt"]
assert t["turns"][0]["prompt_tokens"][:2] == [1, 9690], t["turns"][0]["prompt_tokens"][:4]   # <|im_start|>system: ChatML, no BOS
ckpt = os.path.join(run, "checkpoints", "latest")
tc = json.load(open(os.path.join(ckpt, "tokenizer_config.json")))
assert "<|im_start|>" in tc.get("chat_template", ""), "the checkpoint lost the chat template"
print("smollm2 GRPO run: %d steps, eval %s -> %s" % (len(train), evals[0]["eval_accuracy"], evals[-1]["eval_accuracy"]))
PY
echo '[{"role": "user", "content": "What is 2 + 3 + 4?"}]' > "$W/messages.json"
"$TROUPE" generate "$W/run/checkpoints/latest" --messages "$W/messages.json" --temperature 0 --max-tokens 12 --json \
  > "$W/generate.txt"
tail -1 "$W/generate.txt" | "$PY" -c "
import json, sys
r = json.loads(sys.stdin.read())
print(repr(r['text']))
assert r['prompt_tokens'][0] == 1 and len(r['tokens']) > 0, r   # <|im_start|> first: the template's, no BOS added
"
