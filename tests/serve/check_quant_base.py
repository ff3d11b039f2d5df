#!/usr/bin/env python3
"""`troupe generate`, `score` and `serve` over a quantized base (QLoRA's policy.base_dtype; stdlib only), on
tests/gguf/tiny_llama.gguf (its projections in Q8_0 and Q4_1 blocks, the tied head in Q8_0):
  - generate GGUF --base-dtype gguf (and q8_0): the JSON says so, and `score` with the same flag gives
    the sampled tokens' log-probs (the KV-cache decode against the packed forward, within 1e-4);
  - an adapter directory whose base.json records "base_dtype": "gguf" (what a QLoRA run's LoRA checkpoint
    writes) samples over the .gguf's own blocks by itself: the same tokens and log-probs, bit for bit, as
    --base-dtype gguf, while --base-dtype fp32 overrides the record;
  - troupe serve GGUF --base-dtype gguf, and serve ADAPTER_DIR, say base_dtype gguf when they start and
    answer with the tokens generate samples;
  - bad input is exit 2 naming it: --base-dtype q9 (and the choices), gguf over a model directory, a
    base.json "base_dtype" that is no dtype (the file, the key and the value).
    check_quant_base.py TROUPE GGUF"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_serve_adapters import (MAX_TOKENS, complete, expect_exit2, fail, small_adapter, stop,  # noqa: E402
                                  troupe)

PROMPTS = ["hello world", "a b c"]


def generate(exe, model, prompt, *flags):
    args = ["generate", model, "--prompt", prompt, "--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--json"]
    return json.loads(troupe(exe, *args, *flags).stdout.strip().splitlines()[-1])


def check_scored(exe, model, g, dtype):
    ids = ",".join(str(t) for t in g["prompt_tokens"] + g["tokens"])
    j = json.loads(troupe(exe, "score", model, "--tokens", ids, "--base-dtype", dtype).stdout.strip().splitlines()[-1])
    scored = j["logprobs"][-len(g["tokens"]):]
    for i, (a, b) in enumerate(zip(scored, g["logprobs"])):
        if abs(a - b) > 1e-4:
            fail(f"{dtype}: token {i}: score gives {a}, the sampler {b}")


def start(exe, model, *extra):
    p = subprocess.Popen([exe, "serve", model, "--bind", "127.0.0.1:0", "--threads", "1", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if "listening on http://" not in line:
        p.kill()
        fail(f"troupe serve {model} {extra} did not start: {line!r} {p.stderr.read()}")
    return p, line.split("listening on ")[1].split()[0], line


def served_tokens(exe, model, extra, want):
    p, url, line = start(exe, model, "--model-name", "m", *extra)
    try:
        if "base_dtype gguf" not in line:
            fail(f"troupe serve {model} {extra}: the start line does not say base_dtype gguf: {line!r}")
        for prompt, w in zip(PROMPTS, want):
            got = complete(url, "m", prompt)
            if got != w["tokens"]:
                fail(f"troupe serve {model} {extra}, {prompt!r}: served {got}, troupe generate {w['tokens']}")
    finally:
        stop(p)


def main():
    if len(sys.argv) != 3:
        fail(__doc__)
    exe, gguf = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory(prefix="troupe_quant_base_") as tmp:
        imported = os.path.join(tmp, "imported")
        troupe(exe, "import", gguf, imported)
        base = {}
        for dtype in ("gguf", "q8_0"):
            base[dtype] = [generate(exe, gguf, p, "--base-dtype", dtype) for p in PROMPTS]
            for g in base[dtype]:
                if g["base_dtype"] != dtype or not g["tokens"]:
                    fail(f"generate --base-dtype {dtype}: {g}")
                check_scored(exe, gguf, g, dtype)
        if generate(exe, gguf, PROMPTS[0])["base_dtype"] != "fp32":
            fail("generate without --base-dtype: not an fp32 base")
        print("generate and score over a gguf / q8_0 base agree")

        adapter = small_adapter(os.path.join(tmp, "qlora_ckpt"), imported,
                                ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"], 2, 6.0, 5)
        with open(os.path.join(adapter, "base.json"), "w") as f:
            json.dump({"path": gguf, "fingerprint": None, "base_dtype": "gguf"}, f)
        recorded = [generate(exe, adapter, p) for p in PROMPTS]
        flagged = [generate(exe, adapter, p, "--base-dtype", "gguf") for p in PROMPTS]
        for r, f in zip(recorded, flagged):
            if r["base_dtype"] != "gguf" or (r["tokens"], r["logprobs"]) != (f["tokens"], f["logprobs"]):
                fail(f"the adapter on base.json's base_dtype: {r}, with --base-dtype gguf: {f}")
        if [r["tokens"] for r in recorded] == [b["tokens"] for b in base["gguf"]]:
            fail("the adapter samples what the base samples: the test adapter is too weak")
        if generate(exe, adapter, PROMPTS[0], "--base-dtype", "fp32")["base_dtype"] != "fp32":
            fail("--base-dtype fp32 does not override base.json's base_dtype")
        print("an adapter directory samples over the base_dtype its base.json records")

        served_tokens(exe, gguf, ["--base-dtype", "gguf"], base["gguf"])
        served_tokens(exe, adapter, [], recorded)
        print("troupe serve over a gguf base answers what generate samples")

        expect_exit2(exe, ["generate", gguf, "--prompt", "x", "--base-dtype", "q9"],
                     ['--base-dtype is "q9"', "fp32, bf16, q8_0, q4_k, gguf"], "an unknown --base-dtype")
        expect_exit2(exe, ["serve", imported, "--bind", "127.0.0.1:0", "--base-dtype", "gguf"],
                     ["gguf", imported], "gguf over a model directory")
        bad = os.path.join(tmp, "bad_dtype")
        small_adapter(bad, imported, ["model.layers.0.self_attn.q_proj"], 2, 6.0, 6)
        with open(os.path.join(bad, "base.json"), "w") as f:
            json.dump({"path": gguf, "fingerprint": None, "base_dtype": "q9"}, f)
        expect_exit2(exe, ["generate", bad, "--prompt", "x"], [os.path.join(bad, "base.json"), "base_dtype", '"q9"'],
                     "base.json's base_dtype is no dtype")
    print("ok")


if __name__ == "__main__":
    main()
