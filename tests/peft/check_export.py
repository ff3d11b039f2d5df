#!/usr/bin/env python3
"""`troupe export` end to end on the PEFT fixtures of this folder (make_peft_fixture.py).
    check_export.py peft-loads TROUPE   policy.lora_peft_io.peft_loads: `troupe export --base` rewrites each
                                        PEFT adapter (write_peft_adapter); PeftModel.from_pretrained loads
                                        troupe's files and gives the fixture's logits
    check_export.py merge TROUPE        launch.export_merge: a troupe LoRA checkpoint (adapter + base.json)
                                        -> `export --merge`; transformers loads OUT_DIR, logits == PEFT's,
                                        the base's tokenizer files and chat template are there
    check_export.py errors TROUPE       launch.export_errors: every bad input exits 2 naming the file / key
    check_export.py gguf TROUPE         launch.export_gguf: an adapter merged into a .gguf base (tests/gguf/
                                        tiny_qwen3.gguf): W' - W == s·B·A on the adapted modules, the rest equal
The first two need peft + transformers + torch: they re-run themselves with ensure_peft.py's venv."""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CASES = {"llama": "llama", "qwen3": "qwen3", "qwen3_rslora": "qwen3"}
TOL_ABS, TOL_REL = 5e-5, 1e-5  # the hf_fixture golden tolerance


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


def in_peft_venv():
    """Re-runs this script with a Python that has peft, transformers and torch (first use installs them)."""
    try:
        import peft  # noqa: F401
        import transformers  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("TROUPE_PEFT_REEXEC"):
        fail("the venv of ensure_peft.py cannot import peft / transformers")
    r = subprocess.run([sys.executable, os.path.join(HERE, "ensure_peft.py")], stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        fail("ensure_peft.py failed")
    py = r.stdout.strip().splitlines()[-1]
    os.environ["TROUPE_PEFT_REEXEC"] = "1"
    os.execv(py, [py] + sys.argv)


def troupe(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)


def export(exe, *args):
    r = troupe(exe, "export", *args)
    if r.returncode != 0:
        fail(f"troupe export {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


def base_dir(case):
    return os.path.join(ROOT, "tests", "hf_fixture", CASES[case])


def check_logits(logits, expected, what):
    import torch
    ref = torch.tensor(expected["logits"]).reshape(logits.shape)
    d = (logits - ref).abs()
    bad = d > TOL_ABS + TOL_REL * ref.abs()
    if bad.any():
        fail(f"{what}: {int(bad.sum())} logits differ from PEFT's, max |d| = {float(d.max()):.3g}")
    print(f"{what}: max |logit - PEFT| = {float(d.max()):.3g}")


def logits_of(model, expected):
    import torch
    with torch.no_grad():
        return model(torch.tensor([expected["tokens"]])).logits[0]


def peft_loads(exe, tmp):
    import peft
    import torch
    import transformers
    for case in CASES:
        out = os.path.join(tmp, case)
        export(exe, os.path.join(HERE, case, "adapter"), out, "--base", base_dir(case))
        for f in ("adapter_config.json", "adapter_model.safetensors", "base.json"):
            if not os.path.exists(os.path.join(out, f)):
                fail(f"{case}: troupe export wrote no {f}")
        ref = json.load(open(os.path.join(out, "base.json")))
        if os.path.realpath(ref["path"]) != os.path.realpath(base_dir(case)) or not ref["fingerprint"].startswith("xxh3:"):
            fail(f"{case}: base.json is {ref}")
        base = transformers.AutoModelForCausalLM.from_pretrained(base_dir(case), dtype=torch.float32)
        model = peft.PeftModel.from_pretrained(base, out)
        model.eval()
        expected = json.load(open(os.path.join(HERE, case, "expected.json")))
        check_logits(logits_of(model, expected), expected, f"{case}: PeftModel.from_pretrained(troupe's adapter)")


def merge(exe, tmp):
    import torch
    import transformers
    for case in CASES:
        # The base with a chat template and tokenizer_config.json, to see them copied.
        base = os.path.join(tmp, "base_" + case)
        shutil.copytree(base_dir(case), base)
        with open(os.path.join(base, "chat_template.jinja"), "w") as f:
            f.write("{% for m in messages %}{{ m['content'] }}{% endfor %}")
        with open(os.path.join(base, "tokenizer_config.json"), "w") as f:
            json.dump({"eos_token": "<eos>"}, f)
        ckpt, out = os.path.join(tmp, "ckpt_" + case), os.path.join(tmp, "merged_" + case)
        export(exe, os.path.join(HERE, case, "adapter"), ckpt, "--base", base)  # the LoRA checkpoint layout
        r = export(exe, ckpt, out, "--merge")
        if "merged" not in r.stdout:
            fail(f"{case}: export --merge printed {r.stdout!r}")
        for f in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "tokenizer_config.json"):
            if not os.path.exists(os.path.join(out, f)):
                fail(f"{case}: the merged directory has no {f}")
        for f in ("tokenizer.json", "chat_template.jinja", "tokenizer_config.json"):
            if open(os.path.join(out, f), "rb").read() != open(os.path.join(base, f), "rb").read():
                fail(f"{case}: {f} is not the base's")
        model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        model.eval()
        expected = json.load(open(os.path.join(HERE, case, "expected.json")))
        check_logits(logits_of(model, expected), expected, f"{case}: transformers on `troupe export --merge`")


def expect_error(exe, args, needles, what):
    r = troupe(exe, "export", *args)
    if r.returncode != 2:
        fail(f"{what}: exit {r.returncode}, expected 2\nstdout: {r.stdout}\nstderr: {r.stderr}")
    for n in needles:
        if n not in r.stderr:
            fail(f"{what}: the error does not name {n!r}: {r.stderr}")
    print(f"{what}: {r.stderr.strip().splitlines()[-1]}")


def errors(exe, tmp):
    adapter, llama, qwen3 = os.path.join(HERE, "llama", "adapter"), base_dir("llama"), base_dir("qwen3")
    ckpt = os.path.join(tmp, "ckpt")
    export(exe, adapter, ckpt, "--base", llama)

    def variant(name, edit_config=None, base_json=None, drop=None):
        d = os.path.join(tmp, name)
        shutil.copytree(ckpt, d)
        if edit_config:
            p = os.path.join(d, "adapter_config.json")
            j = json.load(open(p))
            edit_config(j)
            json.dump(j, open(p, "w"))
        if base_json is not None:
            with open(os.path.join(d, "base.json"), "w") as f:
                f.write(base_json if isinstance(base_json, str) else json.dumps(base_json))
        if drop:
            os.remove(os.path.join(d, drop))
        return d

    out = lambda name: os.path.join(tmp, "out_" + name)  # noqa: E731
    expect_error(exe, [os.path.join(tmp, "absent"), out("a")], [os.path.join(tmp, "absent"), "not a directory"],
                 "absent checkpoint")
    d = variant("no_base_json", drop="base.json")
    expect_error(exe, [d, out("b")], [os.path.join(d, "base.json"), "--base"], "no base.json")
    d = variant("no_weights", drop="adapter_model.safetensors")
    expect_error(exe, [d, out("c"), "--merge"], [os.path.join(d, "adapter_model.safetensors")], "no adapter weights")
    d = variant("no_config", drop="adapter_config.json")
    expect_error(exe, [d, out("d")], [os.path.join(d, "adapter_config.json")], "no adapter_config.json")
    d = variant("dora", edit_config=lambda j: j.update(use_dora=True))
    expect_error(exe, [d, out("e"), "--merge"], [os.path.join(d, "adapter_config.json"), "'use_dora'"], "use_dora")
    d = variant("unknown_key", edit_config=lambda j: j.update(fancy_new_mode={"on": True}))
    expect_error(exe, [d, out("f"), "--merge"], [os.path.join(d, "adapter_config.json"), "'fancy_new_mode'"], "unknown key")
    d = variant("rank", edit_config=lambda j: j.update(r=8))
    expect_error(exe, [d, out("g"), "--merge"], [os.path.join(d, "adapter_model.safetensors"), "lora_A.weight", "r is 8"],
                 "r disagrees with the tensors")
    expect_error(exe, [os.path.join(HERE, "qwen3", "adapter"), out("h"), "--merge", "--base", llama],
                 ["k_proj.lora_B.weight", "(48, 4)", "(32, 64)"], "shapes of another base")
    fp = json.load(open(os.path.join(ckpt, "base.json")))
    d = variant("fingerprint", base_json={"path": llama, "fingerprint": "xxh3:0000000000000000"})
    expect_error(exe, [d, out("i"), "--merge"], [os.path.join(d, "base.json"), "'fingerprint'", fp["fingerprint"]],
                 "fingerprint mismatch")
    d = variant("other_base", base_json={"path": qwen3, "fingerprint": fp["fingerprint"]})
    expect_error(exe, [d, out("j"), "--merge"], [os.path.join(d, "base.json"), "'fingerprint'"], "base.json names another base")
    d = variant("bad_base_json", base_json='{"path": ')
    expect_error(exe, [d, out("k")], [os.path.join(d, "base.json"), "JSON"], "base.json not JSON")
    d = variant("base_gone", base_json={"path": os.path.join(tmp, "gone"), "fingerprint": None})
    expect_error(exe, [d, out("l"), "--merge"], [os.path.join(tmp, "gone"), "does not exist", os.path.join(d, "base.json")],
                 "base missing")
    os.makedirs(out("m"))
    open(os.path.join(out("m"), "x"), "w").close()
    expect_error(exe, [ckpt, out("m"), "--merge"], [out("m"), "not empty"], "OUT_DIR not empty")
    if os.path.exists(out("i")) or os.path.exists(out("j")):
        fail("a refused export left its output directory behind")
    r = troupe(exe, "export", "--help")
    if r.returncode != 0 or "--merge" not in r.stdout or "base.json" not in r.stdout:
        fail(f"troupe export --help: {r.stdout}")


def read_safetensors(path):
    """{name: (shape, [floats])} of an F32 safetensors file (the format, by hand: no packages needed)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (path, name, e["dtype"])
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


def gguf(exe, tmp):
    os.environ["TROUPE_CACHE"] = os.path.join(tmp, "cache")
    model = os.path.join(ROOT, "tests", "gguf", "tiny_qwen3.gguf")
    imported = os.path.join(tmp, "imported")
    r = troupe(exe, "import", model, imported)
    if r.returncode != 0:
        fail(f"troupe import: {r.stderr}")
    base = read_safetensors(os.path.join(imported, "model.safetensors"))
    rnd, r_, alpha = random.Random(7), 2, 6.0
    adapter, modules = {}, ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"]
    for m in modules:
        out_f, in_f = base[m + ".weight"][0]
        adapter[f"base_model.model.{m}.lora_A.weight"] = ([r_, in_f], [rnd.uniform(-1, 1) for _ in range(r_ * in_f)])
        adapter[f"base_model.model.{m}.lora_B.weight"] = ([out_f, r_], [rnd.uniform(-1, 1) for _ in range(out_f * r_)])
    d = os.path.join(tmp, "adapter")
    os.makedirs(d)
    write_safetensors(os.path.join(d, "adapter_model.safetensors"), adapter)
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": r_, "lora_alpha": alpha, "target_modules": ["q_proj", "down_proj"],
                   "task_type": "CAUSAL_LM", "bias": "none"}, f)
    out = os.path.join(tmp, "merged")
    export(exe, d, out, "--merge", "--base", model)
    merged = read_safetensors(os.path.join(out, "model.safetensors"))
    if set(merged) != set(base):
        fail(f"merged tensors {sorted(set(merged) ^ set(base))} differ from the imported base's")
    s = alpha / r_
    for name, (shape, w) in base.items():
        m = name[:-len(".weight")]
        if m not in modules:
            if merged[name][1] != w:
                fail(f"{name} changed but is not adapted")
            continue
        (_, a), (_, b) = adapter[f"base_model.model.{m}.lora_A.weight"], adapter[f"base_model.model.{m}.lora_B.weight"]
        out_f, in_f = shape
        worst = max(abs(merged[name][1][o * in_f + i] - w[o * in_f + i] - s * sum(b[o * r_ + k] * a[k * in_f + i] for k in range(r_)))
                    for o in range(out_f) for i in range(in_f))
        if worst > 1e-5:
            fail(f"{name}: merged - base differs from s*B*A by {worst:.3g}")
        print(f"{name}: max |W' - W - s*B*A| = {worst:.3g}")
    if not os.path.exists(os.path.join(out, "tokenizer.json")):
        fail("the merged directory has no tokenizer.json")
    r = troupe(exe, "score", out, "--text", "hello")
    if r.returncode != 0:
        fail(f"troupe score on the merged directory: {r.stderr}")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("peft-loads", "merge", "errors", "gguf"):
        fail(__doc__)
    mode, exe = sys.argv[1], os.path.abspath(sys.argv[2])
    if mode in ("peft-loads", "merge"):
        in_peft_venv()
    with tempfile.TemporaryDirectory(prefix="troupe_export_") as tmp:
        {"peft-loads": peft_loads, "merge": merge, "errors": errors, "gguf": gguf}[mode](exe, tmp)
    print("ok")


if __name__ == "__main__":
    main()
