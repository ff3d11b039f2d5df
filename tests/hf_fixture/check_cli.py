#!/usr/bin/env python3
"""CLI checks of `troupe score` / `troupe generate` against expected.json (run by ctest).
    check_cli.py score TROUPE DIR          --tokens and --text log-probs match DIR/expected.json
    check_cli.py generate TROUPE DIR       greedy continuation matches; seeded sampling repeats
    check_cli.py errors TROUPE FIXTURE_DIR bad directories, config.json keys and tensors exit 2 naming
                                           the file and the key or tensor
Exits non-zero on any mismatch. Standard library only."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

TOL = 5e-5


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    return p.returncode, p.stdout, p.stderr


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def last_json(out):
    lines = [l for l in out.splitlines() if l.strip()]
    if not lines:
        fail("no output")
    return json.loads(lines[-1])


def compare(got, case, what):
    if got["tokens"] != case["tokens"]:
        fail(f"{what}: tokens {got['tokens']} != expected {case['tokens']}")
    want = case["logprobs"]
    if len(got["logprobs"]) != len(want):
        fail(f"{what}: {len(got['logprobs'])} log-probs, expected {len(want)}")
    worst = max(abs(a - b) for a, b in zip(got["logprobs"], want))
    print(f"{what}: {len(want)} log-probs, max |diff| = {worst:.3g}")
    if worst > TOL:
        fail(f"{what}: log-prob mismatch {worst} > {TOL}")


def check_score(troupe, d):
    exp = json.load(open(os.path.join(d, "expected.json")))
    for i, case in enumerate(exp["cases"]):
        rc, out, err = run([troupe, "score", d, "--tokens", ",".join(map(str, case["tokens"]))])
        if rc != 0:
            fail(f"score --tokens exit {rc}: {err}")
        compare(last_json(out), case, f"{d} case {i} --tokens")
        if case.get("text") is not None:
            rc, out, err = run([troupe, "score", d, "--text", case["text"]])
            if rc != 0:
                fail(f"score --text exit {rc}: {err}")
            compare(last_json(out), case, f"{d} case {i} --text")


def check_generate(troupe, d):
    exp = json.load(open(os.path.join(d, "expected.json")))
    g = exp["greedy"]
    n = len(g["new_tokens"])
    rc, out, err = run([troupe, "generate", d, "--prompt", g["prompt"], "--temperature", "0", "--max-tokens", str(n), "--json"])
    if rc != 0:
        fail(f"generate exit {rc}: {err}")
    got = last_json(out)
    if got["prompt_tokens"] != g["prompt_tokens"]:
        fail(f"prompt tokens {got['prompt_tokens']} != {g['prompt_tokens']}")
    if got["tokens"] != g["new_tokens"]:
        fail(f"greedy tokens {got['tokens']} != transformers {g['new_tokens']}")
    print(f"{d}: greedy continuation matches transformers ({n} tokens)")
    outs = [run([troupe, "generate", d, "--prompt", g["prompt"], "--seed", "5", "--max-tokens", "12", "--json"]) for _ in range(2)]
    if any(o[0] != 0 for o in outs) or outs[0][1] != outs[1][1]:
        fail(f"seeded sampling is not repeatable: {outs}")
    if len(last_json(outs[0][1])["tokens"]) == 0:
        fail("sampling produced no tokens")
    rc, out, err = run([troupe, "generate", d, "--prompt", g["prompt"], "--max-tokens", "4"])
    if rc != 0 or not out:
        fail(f"plain generate exit {rc}: {err}")
    print(f"{d}: seeded sampling repeatable; plain text output ok")


def edit_safetensors_header(path, edit):
    """Rewrites the JSON header of a .safetensors file in place (same length, padded with spaces)."""
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    edit(header)
    new = json.dumps(header, separators=(",", ":")).encode()
    if len(new) > n:
        fail("edited safetensors header is longer than the original")
    open(path, "wb").write(data[:8] + new + b" " * (n - len(new)) + data[8 + n:])


def check_bad_keys_and_tensors(troupe, fixture, tmp):
    """Unknown family, unsupported config.json values, a missing tensor, a tensor of the wrong shape."""
    base = json.load(open(os.path.join(fixture, "config.json")))
    cfg_cases = [
        ({"model_type": "gpt_neox"}, ["model_type", "gpt_neox"]),
        ({"hidden_act": "gelu"}, ["hidden_act", "gelu"]),
        ({"mlp_bias": True}, ["mlp_bias"]),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, ["rope_scaling", "yarn"]),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}, ["rope_parameters", "dynamic"]),
        ({"use_sliding_window": True, "sliding_window": 16}, ["sliding_window 16"]),
    ]
    if base["model_type"] in ("qwen2", "qwen2_moe", "mixtral"):
        cfg_cases.append(({"attention_bias": True}, ["attention_bias", base["model_type"]]))
    for i, (change, parts) in enumerate(cfg_cases):
        d = os.path.join(tmp, f"cfg{i}")
        shutil.copytree(fixture, d)
        open(os.path.join(d, "config.json"), "w").write(json.dumps(dict(base, **change)))
        rc, out, err = run([troupe, "score", d, "--tokens", "1,2,3"])
        for p in parts + [os.path.join(d, "config.json")]:
            if rc != 2 or p not in err:
                fail(f"config.json {change}: exit {rc}, {p!r} not in stderr {err!r}")
    def rename(h):
        h["model.norm.weighX"] = h.pop("model.norm.weight")
    def reshape(h):
        h["model.norm.weight"]["shape"] = [1] + h["model.norm.weight"]["shape"]
    for what, edit, parts in (("missing tensor", rename, ["missing tensor 'model.norm.weight'"]),
                              ("wrong shape", reshape, ["model.norm.weight", "shape"])):
        d = os.path.join(tmp, what.replace(" ", "_"))
        shutil.copytree(fixture, d)
        edit_safetensors_header(os.path.join(d, "model.safetensors"), edit)
        rc, out, err = run([troupe, "score", d, "--tokens", "1,2,3"])
        for p in parts + [os.path.join(d, "model.safetensors")]:
            if rc != 2 or p not in err:
                fail(f"{what}: exit {rc}, {p!r} not in stderr {err!r}")
    print(f"{len(cfg_cases)} unsupported config.json values, a missing and a misshapen tensor exit 2 naming file and name")


def check_errors(troupe, fixture):
    tmp = tempfile.mkdtemp(prefix="troupe_cli_errors_")
    try:
        d = os.path.join(tmp, "m")
        shutil.copytree(fixture, d)
        cases = []
        st = os.path.join(d, "model.safetensors")
        data = open(st, "rb").read()
        open(st, "wb").write(data[: len(data) - 100])
        cases.append(("truncated weights", "model.safetensors"))
        rc, out, err = run([troupe, "score", d, "--tokens", "1,2,3"])
        if rc != 2 or "model.safetensors" not in err or "truncated" not in err:
            fail(f"truncated weights: exit {rc}, stderr {err!r}")
        os.remove(st)
        rc, out, err = run([troupe, "score", d, "--tokens", "1,2,3"])
        if rc != 2 or "model.safetensors" not in err:
            fail(f"missing weights: exit {rc}, stderr {err!r}")
        open(os.path.join(d, "config.json"), "w").write("{bad json")
        rc, out, err = run([troupe, "generate", d, "--prompt", "hi"])
        if rc != 2 or "config.json" not in err:
            fail(f"bad config.json: exit {rc}, stderr {err!r}")
        rc, out, err = run([troupe, "score", os.path.join(tmp, "absent"), "--tokens", "1,2"])
        if rc != 2 or "absent" not in err:
            fail(f"absent dir: exit {rc}, stderr {err!r}")
        rc, out, err = run([troupe, "score", fixture, "--tokens", "1,99999"])
        if rc != 2 or "99999" not in err:
            fail(f"token out of range: exit {rc}, stderr {err!r}")
        rc, out, err = run([troupe, "score", fixture, "--tokens", "1,two"])
        if rc != 2 or "two" not in err:
            fail(f"bad --tokens: exit {rc}, stderr {err!r}")
        print("bad directories and inputs exit 2 naming the file or value")
        check_bad_keys_and_tensors(troupe, fixture, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    mode, troupe, d = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "make-and-score":  # d = output dir; argv[4] = make_checkpoint binary, argv[5] = family
        shutil.rmtree(d, ignore_errors=True)
        rc, out, err = run([sys.argv[4], sys.argv[5], d])
        if rc != 0:
            fail(f"make_checkpoint exit {rc}: {err}")
        check_score(troupe, d)
        rc, out, err = run([troupe, "generate", d, "--prompt", "12+", "--max-tokens", "5", "--seed", "1"])
        if rc != 0:
            fail(f"generate on our checkpoint exit {rc}: {err}")
        shutil.rmtree(d, ignore_errors=True)
    else:
        {"score": check_score, "generate": check_generate, "errors": check_errors}[mode](troupe, d)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
