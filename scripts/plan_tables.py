#!/usr/bin/env python3
"""Prints docs/memory.md's "8 x 80 GB GPUs" table from `troupe plan --json` of tests/plan/rl_8gpu.yaml.

    python3 scripts/plan_tables.py [TROUPE]   (TROUPE: default build/bin/troupe; run from the repository root)
"""
import json
import subprocess
import sys

TROUPE = sys.argv[1] if len(sys.argv) > 1 else "build/bin/troupe"
GIB = 1024.0 ** 3


def plan(model, lora, shard):
    cmd = [TROUPE, "plan", "tests/plan/rl_8gpu.yaml", "--set", f"policy.path=tests/plan/models/{model}",
           "--device-memory", "80GB", "--shard", shard, "--json"]
    if lora:  # rank 16 on every linear layer; on the MoE model on attention only (q, k, v, o)
        cmd += ["--set", "policy.lora.rank=16"]
        if model == "qwen3-30b-a3b":
            cmd += ["--set", "policy.lora.targets=[q,k,v,o]"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return json.loads(out.stdout)


def row(rows, role, index):
    return next(r for r in rows if r["role"] == role and r["index"] == index)


def gib(b):
    return f"{b / GIB:.1f}"


def fits(r):
    return f"{gib(r['device_bytes'])} ({'yes' if r['fits'] else '**no**'})"


print("| model | training | shard | learner weights | grads | AdamW | activations | collectives | learner GPU (fits) "
      "| learner host | learner 0 host | generator GPU (fits) | generator host |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for model in ["qwen3-8b", "qwen3-30b-a3b", "qwen3-1.7b", "llama-3-8b"]:
    for lora in [False, True]:
        for shard in ["none", "parameters"]:
            j = plan(model, lora, shard)
            l1, l0, g0 = row(j["rows"], "learner", 1), row(j["rows"], "learner", 0), row(j["rows"], "generator", 0)
            print(f"| {model} | {'LoRA r16' if lora else 'full'} | {shard} | {gib(l1['weights_bytes'])} | "
                  f"{gib(l1['gradients_bytes'])} | {gib(l1['optimizer_bytes'])} | {gib(l1['activations_bytes'])} | "
                  f"{gib(l1['collectives_bytes'])} | {fits(l1)} | {gib(l1['host_bytes'])} | {gib(l0['host_bytes'])} | "
                  f"{fits(g0)} | {gib(g0['host_bytes'])} |")
