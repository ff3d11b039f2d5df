#!/usr/bin/env bash
# e2e.smollm2_lora: configs/smollm2_lora_grpo.yaml shortened to 2 GRPO steps on the real
# SmolLM2-135M-Instruct GGUF (fetched on first use), its Q4_1 blocks the frozen base (base_dtype: gguf):
# the run completes, evaluates before and after, trains only the rank-16 adapters (every linear layer,
# 30 layers x 7 modules), and checkpoints them as a PEFT adapter beside base.json naming the GGUF.
# Usage: grpo_smollm2_lora.sh TROUPE PYTHON SRC_DIR WORK_DIR
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 W=$4
rm -rf "$W" && mkdir -p "$W"
GGUF="$(bash "$SRC/tests/gguf/fetch_smollm2.sh" "$PY")"
"$TROUPE" run "$SRC/configs/smollm2_lora_grpo.yaml" --set run.dir="$W/run" --set policy.path="$GGUF" \
  --set grpo.max_steps=2 --set rollout.prompts_per_step=2 --set rollout.num_generations=4 \
  --set rollout.max_response_length=16 --set eval.num_prompts=4 --set logger.progress=plain
"$PY" "$SRC/tests/e2e/check_run.py" steps "$W/run" 2
"$PY" - "$W/run" "$GGUF" <<'PY'
import json, os, sys
run, gguf = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
evals = [r for r in rows if "eval_accuracy" in r]
assert [r["step"] for r in evals] == [0, 2], [r["step"] for r in evals]
resolved = open(os.path.join(run, "config.resolved.yaml")).read()
assert 'base_dtype: "gguf"' in resolved, "the config trains on the GGUF's own blocks"
train = [r for r in rows if "eval_accuracy" not in r]
for r in train:
    assert 0.0 <= r["reward_mean"] <= 1.0 and r["grad_norm"] >= 0.0 and r["lr"] > 0, r
ckpt = os.path.realpath(os.path.join(run, "checkpoints", "latest"))
assert not os.path.exists(os.path.join(ckpt, "model.safetensors")), "a LoRA checkpoint holds the adapters alone"
cfg = json.load(open(os.path.join(ckpt, "adapter_config.json")))
assert cfg["peft_type"] == "LORA" and cfg["r"] == 16 and cfg["lora_alpha"] == 32, cfg
assert len(cfg["target_modules"]) == 30 * 7, len(cfg["target_modules"])
size = os.path.getsize(os.path.join(ckpt, "adapter_model.safetensors"))
assert 4_800_000 * 4 < size < 5_000_000 * 4, size   # 4.88M fp32 adapter values
base = json.load(open(os.path.join(ckpt, "base.json")))
assert base["path"] == os.path.abspath(gguf), base
print("smollm2 LoRA GRPO run: %d steps, eval %s -> %s, adapter %d bytes" %
      (len(train), evals[0]["eval_accuracy"], evals[-1]["eval_accuracy"], size))
PY
