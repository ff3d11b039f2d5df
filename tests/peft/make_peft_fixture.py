#!/usr/bin/env python3
"""Makes the committed PEFT LoRA fixtures under tests/peft/ (run by hand, not in CI) on the tiny
llama and qwen3 models of tests/hf_fixture/. For each case: a LoRA adapter made by `peft` on every
linear module (r=4, alpha=8, A and B random so B·A is nonzero), saved with save_pretrained; the
state dict of merge_and_unload(); the PeftModel's logits for a fixed token sequence.
  llama/         llama base
  qwen3/         qwen3 base
  qwen3_rslora/  qwen3 base, use_rslora (s = alpha/sqrt(r))
Each case dir: adapter/ (adapter_config.json, adapter_model.safetensors), merged.safetensors,
expected.json {base, tokens, vocab_size, adapter_tensors {name: shape, first 3 values}, logits (row-major
T x V), the package versions}.
Needs the venv of ensure_peft.py (peft, transformers, torch from PyPI):
    $(python3 tests/peft/ensure_peft.py | tail -1) tests/peft/make_peft_fixture.py
"""
import json
import os

import peft
import safetensors.torch
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOKENS = [1, 17, 42, 99, 5, 250, 301, 7]
CASES = [("llama", "llama", False, 11), ("qwen3", "qwen3", False, 12), ("qwen3_rslora", "qwen3", True, 13)]


def make_case(name, base, rslora, seed):
    base_dir = os.path.join(ROOT, "tests", "hf_fixture", base)
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", use_rslora=rslora,
                          task_type="CAUSAL_LM")
    pm = peft.get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_A" in n or "lora_B" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    pm.peft_config["default"].base_model_name_or_path = "tests/hf_fixture/" + base
    pm.eval()
    out = os.path.join(HERE, name)
    os.makedirs(out, exist_ok=True)
    pm.save_pretrained(os.path.join(out, "adapter"))
    os.remove(os.path.join(out, "adapter", "README.md"))  # PEFT's model card template
    with torch.no_grad():
        logits = pm(torch.tensor([TOKENS])).logits[0]
    merged = pm.merge_and_unload()
    with torch.no_grad():
        merged_logits = merged(torch.tensor([TOKENS])).logits[0]
    assert torch.allclose(logits, merged_logits, atol=1e-4), "merge_and_unload changed the logits"
    sd = {k: v.contiguous() for k, v in merged.state_dict().items()
          if not (k == "lm_head.weight" and merged.config.tie_word_embeddings)}
    safetensors.torch.save_file(sd, os.path.join(out, "merged.safetensors"), metadata={"format": "pt"})
    saved = safetensors.torch.load_file(os.path.join(out, "adapter", "adapter_model.safetensors"))
    probe = {k: {"shape": list(v.shape), "first": [float(x) for x in v.flatten()[:3].tolist()]}
             for k, v in sorted(saved.items())}
    expected = {"base": "tests/hf_fixture/" + base, "tokens": TOKENS, "vocab_size": int(logits.shape[1]),
                "adapter_tensors": probe,
                "logits": [float(f"{x:.8g}") for x in logits.flatten().tolist()],
                "peft": peft.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")
    print("wrote", out)


if __name__ == "__main__":
    for case in CASES:
        make_case(*case)
