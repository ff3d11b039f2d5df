#!/usr/bin/env python3
"""LoRA adapters in `troupe generate`, `troupe eval --checkpoint` and `troupe serve` (stdlib only), on the
tiny Qwen3 fixture (tests/hf_fixture/qwen3) and adapters made from tests/peft's fixtures:
  one    tests/peft/qwen3 (r 4, every linear module, B x 5) as a troupe LoRA checkpoint (`troupe export
         --base`: PEFT files + base.json with the base's path and fingerprint)
  two    tests/peft/qwen3_rslora (use_rslora, B x 5), a plain PEFT directory (no base.json: needs --base)
  three  written here: r 2 on layer 0's q_proj and down_proj only, lora_alpha 6
    check_serve_adapters.py serve TROUPE BASE_DIR   launch.serve_adapters: base + three adapters in one server;
        each request's greedy tokens equal `troupe generate` with that adapter alone (and the base alone), one
        at a time and all at once (mixed batches: peak_batch >= MIN_SHARED, rounds repeat under load); /v1/models; replies name the model;
        `troupe serve ADAPTER_DIR` (base.json, or --base) equals generate too
    check_serve_adapters.py errors TROUPE BASE_DIR  launch.serve_adapters_errors: 404 naming the known models;
        every bad --adapter / adapter directory is exit 2 naming the file, key or value, before serving
    check_serve_adapters.py generate TROUPE BASE_DIR  launch.generate_adapter: generate / score / eval
        --checkpoint on an adapter directory (base.json or --base), and their base-mismatch errors"""
import concurrent.futures
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROMPTS = ["hello world", "the cat sat", "a b c d e"]
MAX_TOKENS = 12
MIN_SHARED = 4  # sequences the engine must have run together at least once
MAX_ROUNDS = 8


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = (e["shape"], list(struct.unpack(f"<{(end - b) // 4}f", raw[8 + n + b:8 + n + end])))
    return out


def write_safetensors(path, tensors):
    header, data = {}, b""
    for name in sorted(tensors):
        shape, values = tensors[name]
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def troupe(exe, *args, check=True):
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)
    if check and r.returncode != 0:
        fail(f"troupe {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


def scaled_copy(src, dst, factor):
    """src's PEFT adapter with every lora_B times factor (so the adapters change greedy outputs)."""
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "adapter_config.json"), dst)
    t = read_safetensors(os.path.join(src, "adapter_model.safetensors"))
    t = {k: (s, [x * factor for x in v] if ".lora_B." in k else v) for k, (s, v) in t.items()}
    write_safetensors(os.path.join(dst, "adapter_model.safetensors"), t)


def small_adapter(d, base, modules, r, alpha, seed, target_modules=None):
    """A PEFT adapter on `modules` of the base (shapes from its model.safetensors), A, B ~ U(-1, 1)."""
    os.makedirs(d)
    shapes = {k: s for k, (s, _) in read_safetensors(os.path.join(base, "model.safetensors")).items()}
    rnd, t = random.Random(seed), {}
    for m in modules:
        out_f, in_f = shapes[m + ".weight"]
        t[f"base_model.model.{m}.lora_A.weight"] = ([r, in_f], [rnd.uniform(-1, 1) for _ in range(r * in_f)])
        t[f"base_model.model.{m}.lora_B.weight"] = ([out_f, r], [rnd.uniform(-1, 1) for _ in range(out_f * r)])
    write_safetensors(os.path.join(d, "adapter_model.safetensors"), t)
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": r, "lora_alpha": alpha, "task_type": "CAUSAL_LM", "bias": "none",
                   "target_modules": target_modules or modules, "lora_dropout": 0.05}, f)
    return d


def make_adapters(exe, base, tmp):
    one_peft = os.path.join(tmp, "one_peft")
    scaled_copy(os.path.join(ROOT, "tests", "peft", "qwen3", "adapter"), one_peft, 5.0)
    one = os.path.join(tmp, "one_ckpt")
    troupe(exe, "export", one_peft, one, "--base", base)  # the LoRA checkpoint layout: + base.json
    two = os.path.join(tmp, "two")
    scaled_copy(os.path.join(ROOT, "tests", "peft", "qwen3_rslora", "adapter"), two, 5.0)
    three = small_adapter(os.path.join(tmp, "three"), base,
                          ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"], 2, 6.0, 3)
    return {"one": one, "two": two, "three": three}


def generate(exe, model, prompt, base=None):
    args = ["generate", model, "--prompt", prompt, "--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--json"]
    if base:
        args += ["--base", base]
    return json.loads(troupe(exe, *args).stdout.strip().splitlines()[-1])["tokens"]


def expected_outputs(exe, base, adapters):
    """{model name: [greedy tokens per prompt]}, each from `troupe generate` with that adapter alone."""
    out = {"base": [generate(exe, base, p) for p in PROMPTS]}
    for name, d in adapters.items():
        out[name] = [generate(exe, d, p, None if name == "one" else base) for p in PROMPTS]
    for name in adapters:
        if out[name] == out["base"]:
            fail(f"adapter {name} samples what the base samples: the test adapters are too weak")
    return out


def start(exe, model, *extra):
    p = subprocess.Popen([exe, "serve", model, "--bind", "127.0.0.1:0", "--threads", "1", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if "listening on http://" not in line:
        p.kill()
        fail(f"troupe serve {model} {extra} did not start: {line!r} {p.stderr.read()}")
    return p, line.split("listening on ")[1].split()[0]


def stop(p):
    p.send_signal(signal.SIGTERM)
    if p.wait(timeout=60) != 0:
        fail(f"troupe serve: exit {p.returncode}: {p.stderr.read()}")


def http(url, body=None, timeout=120):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def complete(url, model, prompt):
    st, j = http(url + "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    if st != 200:
        fail(f"model {model}, prompt {prompt!r}: {st} {j}")
    if j["model"] != model:
        fail(f"the reply names model {j['model']!r}, the request {model!r}")
    return j["choices"][0]["troupe"]["completion_token_ids"]


def check_same(got, want, what):
    if got != want:
        fail(f"{what}: served {got}, troupe generate {want}")


def serve(exe, base, tmp):
    adapters = make_adapters(exe, base, tmp)
    want = expected_outputs(exe, base, adapters)
    flags = [x for name, d in adapters.items() for x in ("--adapter", f"{name}={d}")]
    p, url = start(exe, base, "--model-name", "base", "--max-batch", "16", *flags)
    try:
        st, models = http(url + "/v1/models")
        ids = [m["id"] for m in models["data"]]
        if st != 200 or ids != ["base", "one", "two", "three"] or models["data"][1].get("parent") != "base":
            fail(f"/v1/models: {st} {models}")
        for name in want:  # one at a time
            for i, prompt in enumerate(PROMPTS):
                check_same(complete(url, name, prompt), want[name][i], f"{name} alone, {prompt!r}")
        jobs = [(name, i) for _ in range(2) for name in want for i in range(len(PROMPTS))]
        # All at once, released by a barrier, so base and adapters share batches. How many share one
        # depends on the machine's load (a tiny model finishes 12 tokens fast), so rounds repeat until
        # the engine has run at least MIN_SHARED sequences together (mixed: more than one model's rows).
        rounds = 0
        while True:
            rounds += 1
            barrier = threading.Barrier(len(jobs))

            def run(job):
                barrier.wait()
                return complete(url, job[0], PROMPTS[job[1]])

            with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
                got = list(pool.map(run, jobs))
            for (name, i), g in zip(jobs, got):
                check_same(g, want[name][i], f"{name} in a mixed batch, {PROMPTS[i]!r}")
            _, health = http(url + "/health")
            if health["peak_batch"] >= MIN_SHARED:
                break
            if rounds == MAX_ROUNDS:
                fail(f"{MAX_ROUNDS} rounds of {len(jobs)} concurrent requests never shared a batch of {MIN_SHARED}: {health}")
        print(f"base + 3 adapters: {len(jobs)} concurrent requests equal troupe generate; "
              f"peak batch {health['peak_batch']} after {rounds} round(s)")
    finally:
        stop(p)
    # One adapter as the model: its base from base.json, or --base.
    for name, extra in (("one", []), ("two", ["--base", base])):
        p, url = start(exe, adapters[name], "--model-name", name, *extra)
        try:
            for i, prompt in enumerate(PROMPTS):
                check_same(complete(url, name, prompt), want[name][i], f"troupe serve {name}'s directory, {prompt!r}")
        finally:
            stop(p)
    print("troupe serve ADAPTER_DIR equals troupe generate ADAPTER_DIR")


def expect_exit2(exe, args, needles, what):
    r = troupe(exe, *args, check=False)
    if r.returncode != 2:
        fail(f"{what}: exit {r.returncode}, expected 2\nstdout: {r.stdout}\nstderr: {r.stderr}")
    if "listening" in r.stdout:
        fail(f"{what}: the server started before refusing")
    for n in needles:
        if n not in r.stderr:
            fail(f"{what}: the error does not name {n!r}: {r.stderr}")
    print(f"{what}: {r.stderr.strip().splitlines()[-1]}")


def variant(src, dst, edit_config=None, base_json=None):
    shutil.copytree(src, dst)
    if edit_config:
        p = os.path.join(dst, "adapter_config.json")
        j = json.load(open(p))
        edit_config(j)
        json.dump(j, open(p, "w"))
    if base_json is not None:
        json.dump(base_json, open(os.path.join(dst, "base.json"), "w"))
    return dst


def errors(exe, base, tmp):
    adapters = make_adapters(exe, base, tmp)
    p, url = start(exe, base, "--model-name", "base", "--adapter", f"one={adapters['one']}",
                   "--adapter", f"two={adapters['two']}")
    try:
        st, j = http(url + "/v1/completions", {"model": "nope", "prompt": "hi", "max_tokens": 2})
        err = j.get("error", {})
        if st != 404 or err.get("code") != "model_not_found" or err.get("param") != "model" or \
                err.get("type") != "invalid_request_error" or not all(f"'{m}'" in err.get("message", "") for m in ("nope", "base", "one", "two")):
            fail(f"unknown model: expected 404 naming 'base', 'one', 'two', got {st} {j}")
        print(f"unknown model: 404 {err['message']}")
    finally:
        stop(p)
    serve_args = ["serve", base, "--bind", "127.0.0.1:0", "--model-name", "base"]
    one, two = adapters["one"], adapters["two"]
    expect_exit2(exe, serve_args + ["--adapter", "one"], ["--adapter one", "NAME=DIR"], "no '='")
    expect_exit2(exe, serve_args + ["--adapter", f"one={one}", "--adapter", f"one={two}"], ["'one'", "twice"], "duplicate name")
    expect_exit2(exe, serve_args + ["--adapter", f"base={one}"], ["'base'", "base model's name"], "the base's name")
    expect_exit2(exe, serve_args + ["--adapter", f"x={os.path.join(tmp, 'absent')}"], [os.path.join(tmp, "absent"), "not a directory"],
                 "absent directory")
    expect_exit2(exe, serve_args + ["--adapter", f"x={base}"], [base, "not a PEFT adapter", "adapter_config.json"], "a model, not an adapter")
    d = variant(two, os.path.join(tmp, "unknown_key"), edit_config=lambda j: j.update(fancy_new_mode={"on": True}))
    expect_exit2(exe, serve_args + ["--adapter", f"x={d}"], [os.path.join(d, "adapter_config.json"), "'fancy_new_mode'"], "unknown key")
    d = variant(two, os.path.join(tmp, "dora"), edit_config=lambda j: j.update(use_dora=True))
    expect_exit2(exe, serve_args + ["--adapter", f"x={d}"], [os.path.join(d, "adapter_config.json"), "'use_dora'"], "use_dora")
    fp = json.load(open(os.path.join(one, "base.json")))["fingerprint"]
    d = variant(one, os.path.join(tmp, "fingerprint"), base_json={"path": base, "fingerprint": "xxh3:0000000000000000"})
    expect_exit2(exe, serve_args + ["--adapter", f"x={d}"],
                 [os.path.join(d, "base.json"), "'fingerprint'", "xxh3:0000000000000000", fp, base], "base fingerprint mismatch")
    llama = os.path.join(ROOT, "tests", "peft", "llama", "adapter")
    expect_exit2(exe, serve_args + ["--adapter", f"x={llama}"], ["k_proj.lora_B.weight", "(32, 4)", "(48, 64)"],
                 "an adapter of another base's shapes")
    d = small_adapter(os.path.join(tmp, "rank"), base, ["model.layers.0.self_attn.k_proj"], 50, 8.0, 5)
    expect_exit2(exe, serve_args + ["--adapter", f"x={d}"],
                 [os.path.join(d, "adapter_config.json"), "'r'", "50", "min(in, out) = 48", "model.layers.0.self_attn.k_proj"],
                 "rank larger than the layer")
    expect_exit2(exe, ["serve", one, "--adapter", f"x={two}"], [one, "itself an adapter"], "an adapter MODEL with --adapter")
    expect_exit2(exe, ["serve", two], [os.path.join(two, "base.json"), "--base"], "a plain PEFT MODEL without --base")


def eval_config(tmp):
    """The quickstart without its fresh-model architecture (policy.path's config.json is the architecture)."""
    import re
    text = open(os.path.join(ROOT, "configs", "quickstart.yaml")).read()
    path = os.path.join(tmp, "loaded.yaml")
    open(path, "w").write(re.sub(r"\n  model:\n(    .*\n)+", "\n", text))
    return path


def generate_mode(exe, base, tmp):
    adapters = make_adapters(exe, base, tmp)
    one, two = adapters["one"], adapters["two"]
    plain = generate(exe, base, PROMPTS[0])
    if generate(exe, one, PROMPTS[0]) == plain:
        fail("generate on the LoRA checkpoint samples what the base samples")
    if generate(exe, two, PROMPTS[0], base) == plain:
        fail("generate on the PEFT adapter with --base samples what the base samples")
    r = troupe(exe, "score", one, "--text", "hello world")
    r0 = troupe(exe, "score", base, "--text", "hello world")
    if json.loads(r.stdout.splitlines()[-1])["logprobs"] == json.loads(r0.stdout.splitlines()[-1])["logprobs"]:
        fail("score on the LoRA checkpoint gives the base's log-probs")
    fp = json.load(open(os.path.join(one, "base.json")))["fingerprint"]
    d = variant(one, os.path.join(tmp, "fingerprint"), base_json={"path": base, "fingerprint": "xxh3:0000000000000000"})
    expect_exit2(exe, ["generate", d, "--prompt", "hi"], [os.path.join(d, "base.json"), "xxh3:0000000000000000", fp],
                 "generate: base fingerprint mismatch")
    expect_exit2(exe, ["generate", two, "--prompt", "hi"], [os.path.join(two, "base.json"), "--base"],
                 "generate: a plain PEFT adapter without --base")
    expect_exit2(exe, ["generate", base, "--base", base, "--prompt", "hi"], ["--base", "adapter_config.json"],
                 "generate: --base on a model directory")
    moe = os.path.join(ROOT, "tests", "hf_fixture", "qwen2")
    expect_exit2(exe, ["generate", one, "--base", moe, "--prompt", "hi"], [os.path.join(one, "base.json"), "'fingerprint'", fp],
                 "generate: --base of another model")
    # eval --checkpoint: a LoRA checkpoint on policy.path (no policy.lora in the config), a PEFT adapter on --base
    cfg = eval_config(tmp)
    sets = ["--set", f"policy.path={base}", "--set", "policy.tokenizer=auto", "--set", "eval.num_prompts=4"]
    for ck, extra in ((one, []), (two, ["--base", base])):
        r = troupe(exe, "eval", cfg, "--checkpoint", ck, *extra, *sets)
        j = json.loads(r.stdout.strip().splitlines()[-1])
        if "eval_accuracy" not in j or j["checkpoint"] != ck:
            fail(f"troupe eval --checkpoint {ck}: {r.stdout}")
    expect_exit2(exe, ["eval", cfg, "--checkpoint", d, *sets], [os.path.join(d, "base.json"), "xxh3:0000000000000000", fp],
                 "eval: base fingerprint mismatch")
    print("generate, score and eval --checkpoint apply the adapter on its base")


def main():
    modes = {"serve": serve, "errors": errors, "generate": generate_mode}
    if len(sys.argv) != 4 or sys.argv[1] not in modes:
        fail(__doc__)
    exe, base = os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    with tempfile.TemporaryDirectory(prefix="troupe_adapters_") as tmp:
        modes[sys.argv[1]](exe, base, tmp)
    print("ok")


if __name__ == "__main__":
    main()
