#!/usr/bin/env python3
"""Checks that transformers loads a troupe-written model directory and reproduces expected log-probs.
    python tests/hf_fixture/check_in_transformers.py DIR EXPECTED.json   (in the fixture venv)
Exits non-zero on a mismatch. Not run in CI (needs transformers and a recent torch)."""
import json
import sys

import torch
import transformers


def main():
    d, exp = sys.argv[1], json.load(open(sys.argv[2]))
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    worst = 0.0
    for c in exp["cases"]:
        ids = c["tokens"]
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
        for i in range(len(ids) - 1):
            worst = max(worst, abs(lp[i, ids[i + 1]].item() - c["logprobs"][i]))
    print(f"{d}: transformers {transformers.__version__}, max |dlogprob| = {worst:.3g}")
    sys.exit(0 if worst < 1e-4 else 1)


if __name__ == "__main__":
    main()
