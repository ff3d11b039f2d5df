#!/usr/bin/env python3
"""launch.wandb: logger.wandb through the real `wandb` package. A short quickstart run with
mode: offline; then its offline W&B run (run.dir/wandb/offline-run-*/run-*.wandb, read record by
record with wandb's own protobuf classes) must hold every numeric field of every metrics.jsonl row,
named <phase>/<field> (eval rows eval/<field>), at the row's step, with the same value; the project
and name are the YAML's. Also: a Python without wandb stops the start (exit 2) saying how to install
it; a W&B process that dies during the run is reported once and the run still finishes (exit 0);
a bad logger.wandb.mode is a config error naming the key.
    check_wandb.py TROUPE SOURCE_DIR WORK_DIR
`wandb` is installed on first use into a venv under $TROUPE_CACHE (default ~/.cache/troupe)/venv-wandb;
the script then re-runs itself with that venv's python."""
import fcntl
import glob
import json
import os
import shutil
import struct
import subprocess
import sys

VENV = os.path.join(os.environ.get("TROUPE_CACHE", os.path.expanduser("~/.cache/troupe")), "venv-wandb")
VENV_PY = os.path.join(VENV, "bin", "python")


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def ensure_wandb():
    try:
        import wandb  # noqa: F401
        return
    except ImportError:
        pass
    if os.path.abspath(sys.executable) == os.path.abspath(VENV_PY):
        fail("the venv has no wandb package after installing it")
    os.makedirs(os.path.dirname(VENV), exist_ok=True)
    with open(VENV + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ok = os.path.exists(VENV_PY) and subprocess.run(
            [VENV_PY, "-c", "import wandb, yaml"], capture_output=True).returncode == 0
        if not ok:
            print(f"installing wandb into {VENV}", flush=True)
            subprocess.run([sys.executable, "-m", "venv", "--clear", VENV], check=True)
            subprocess.run([VENV_PY, "-m", "pip", "install", "-q", "wandb", "pyyaml"], check=True)
    os.execv(VENV_PY, [VENV_PY] + sys.argv)


def wandb_records(path):
    """The protobuf Records of a .wandb file: a header (":W&B", magic, version), then LevelDB-log
    framing: 32 KiB blocks of chunks, each crc32 (4 bytes), length (2), type (1: full, 2: first,
    3: middle, 4: last)."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = open(path, "rb").read()
    if data[:4] != b":W&B":
        fail(f"{path}: not a W&B transaction log (header {data[:7]!r})")
    block, pos, cur, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and n == 0:  # zero padding to the end of the block
            pos += block - pos % block if pos % block else 0
            continue
        cur += data[pos:pos + n]
        pos += n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(cur)
            out.append(rec)
            cur = b""
    return out


def history_of(records):
    """{step: {key: value}} over the history records (keys as wandb.log got them)."""
    hist = {}
    for r in records:
        if r.WhichOneof("record_type") != "history":
            continue
        row = hist.setdefault(r.history.step.num, {})
        for item in r.history.item:
            key = item.key or ".".join(item.nested_key)
            row[key] = json.loads(item.value_json)
    return hist


def expected_of(metrics_path):
    """metrics.jsonl as the sink names it: {step: {<phase>/<field>: value}} (eval rows eval/<field>)."""
    want = {}
    with open(metrics_path) as f:
        for line in f:
            row = json.loads(line)
            is_eval = "eval_accuracy" in row or "eval_reward_mean" in row
            prefix = "eval" if is_eval else row.get("phase", "train")
            for k, v in row.items():
                if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                want.setdefault(row["step"], {})[f"{prefix}/{k}"] = v
    return want


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    return p.returncode, p.stdout, p.stderr


def quick(troupe, src, run_dir, *extra):
    return [troupe, "run", f"{src}/configs/quickstart.yaml", "--set", f"run.dir={run_dir}",
            "--set", "sft.max_steps=4", "--set", "grpo.max_steps=4", "--set", "eval.every=2",
            "--set", "eval.num_prompts=8", "--set", "rollout.prompts_per_step=4",
            "--set", "checkpointing.enabled=false", "--set", "logger.progress=plain",
            "--set", "logger.wandb.project=troupe-test", "--set", "logger.wandb.mode=offline", *extra]


def check_offline_run(troupe, src, work, env):
    run_dir = os.path.join(work, "offline")
    rc, out, err = run(quick(troupe, src, run_dir, "--set", "logger.wandb.name=tiny"), env)
    if rc != 0:
        fail(f"the offline run exited {rc}:\n{err[-4000:]}")
    files = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    if len(files) != 1:
        fail(f"expected one offline W&B run under {run_dir}/wandb, found {files}")
    if not os.path.exists(os.path.join(run_dir, "logs", "wandb.log")):
        fail("no logs/wandb.log in the run directory")
    records = wandb_records(files[0])
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    if not runs or runs[0].project != "troupe-test" or runs[0].display_name != "tiny":
        fail(f"the W&B run's project/name are not the YAML's: {runs[:1]}")
    got = history_of(records)
    want = expected_of(os.path.join(run_dir, "metrics.jsonl"))
    if not want or len(want) < 8:
        fail(f"metrics.jsonl has too few steps: {sorted(want)}")
    checked = 0
    for step, fields in want.items():
        if step not in got:
            fail(f"step {step} is not in the W&B history (its steps: {sorted(got)})")
        for key, v in fields.items():
            if key not in got[step]:
                fail(f"step {step}: {key} is not in the W&B history (it has {sorted(got[step])})")
            g = got[step][key]
            if g != v:
                fail(f"step {step}: {key} = {g!r} in W&B, {v!r} in metrics.jsonl")
            checked += 1
    print(f"offline W&B run holds all {checked} metrics of {len(want)} steps of metrics.jsonl")


def check_missing_wandb(troupe, src, work, env):
    # the same interpreter without site-packages: no wandb there
    fake = os.path.join(work, "python-without-wandb")
    with open(fake, "w") as f:
        f.write(f"#!/bin/sh\nexec {VENV_PY} -S \"$@\"\n")
    os.chmod(fake, 0o755)
    rc, _, err = run(quick(troupe, src, os.path.join(work, "missing")), dict(env, TROUPE_PYTHON=fake))
    if rc != 2 or "pip install wandb" not in err or "logger.wandb" not in err:
        fail(f"a Python without wandb: expected exit 2 saying how to install it, got {rc}:\n{err[-3000:]}")
    print("a Python without wandb: exit 2,", [l for l in err.splitlines() if "pip install wandb" in l][0][:160])


def check_dying_sink(troupe, src, work, env):
    # answers ready, takes one row, then dies: the run must finish and say so once
    fake = os.path.join(work, "python-dying-sink")
    with open(fake, "w") as f:
        f.write("#!/bin/bash\necho ready >&3\nread -r -u 3 line\nexit 7\n")
    os.chmod(fake, 0o755)
    run_dir = os.path.join(work, "dying")
    rc, _, err = run(quick(troupe, src, run_dir), dict(env, TROUPE_PYTHON=fake))
    said = [l for l in err.splitlines() if "W&B logging stopped" in l]
    if rc != 0 or len(said) != 1:
        fail(f"a W&B process that dies: expected exit 0 and one message, got {rc}, {said}:\n{err[-3000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = {json.loads(l)["step"] for l in f}
    if max(steps) != 8:
        fail(f"the run did not train to the end without W&B: steps {sorted(steps)}")
    print("a W&B process that dies: the run finished;", said[0][:160])


def check_bad_mode(troupe, src):
    rc, _, err = run([troupe, "validate", f"{src}/configs/quickstart.yaml", "--set", "logger.wandb.mode=cloud"])
    if rc != 2 or "logger.wandb.mode" not in err or "offline" not in err:
        fail(f"logger.wandb.mode=cloud: expected exit 2 naming the key and its values, got {rc}:\n{err}")
    print("logger.wandb.mode=cloud:", err.strip().splitlines()[-1][:160])


def main():
    ensure_wandb()
    if sys.argv[1:2] == ["--install-only"]:  # (scripts/setup.sh --test: the venv is made before the tests)
        print("wandb is installed:", sys.executable)
        return
    troupe, src, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ, TROUPE_PYTHON=VENV_PY, WANDB_SILENT="true")
    env.pop("WANDB_API_KEY", None)
    check_bad_mode(troupe, src)
    check_offline_run(troupe, src, work, env)
    check_missing_wandb(troupe, src, work, env)
    check_dying_sink(troupe, src, work, env)
    shutil.rmtree(work, ignore_errors=True)
    print("launch.wandb: ok")


if __name__ == "__main__":
    main()
