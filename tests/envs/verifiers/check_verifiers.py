#!/usr/bin/env python3
"""envs.verifiers: troupe as a client of a real verifiers (v1) environment server (the PyPI package
`verifiers`, a ZeroMQ ROUTER speaking msgpack) whose environment (troupe_vf_echo.py: in-memory
tasks, a two-turn chat harness) calls the policy through each generator's rollout.serve endpoint.
    check_verifiers.py TROUPE FIXTURE_MODEL_DIR QWEN3_TEMPLATE
Checks:
  - configs/verifiers_grpo.yaml runs a step against the server (with the small test model);
  - a GRPO run trains on what the endpoint served: no failed episode, reward from the env, and the
    learner's log-probs of the recorded tokens match the sampler's (mismatch_tokens > 0,
    logprob_diff_max small), so prompt ids, completion ids and log-probs were recorded token for
    token; a request without an episode is served (policy_version tagged) while the run goes on;
  - a model without a chat template is served with the built-in tags (a step, no failed episode);
  - the tasks of that run are the taskset's own (config.taskset: its load() through
    envs/python/verifiers_tasks.py, config.eval_size held out), whose loader log is in the run's logs/;
  - failure paths: episodes past timeout_s fail as `timeout`, are counted and the run continues
    (below envs[].max_failure_frac); their retries run at once (12 hung episodes with 2 retries
    each end in about 3 timeouts, not 36); a server answering with bytes that are not msgpack or with the
    wrong schema fails its episodes as `protocol_error` and stops the run (exit 3, naming the env);
    a server that is not there stops the run at start-up (exit 3); a taskset that cannot be loaded
    stops it too (exit 2).
verifiers==0.4.0 needs Python >= 3.11 and openai >= 2.54: it is installed on first use into a venv
under $TROUPE_CACHE (default ~/.cache/troupe)/venv-verifiers, and the script re-runs itself there."""
import fcntl
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(os.environ.get("TROUPE_CACHE", os.path.expanduser("~/.cache/troupe")), "venv-verifiers")
VENV_PY = os.path.join(VENV, "bin", "python")
PACKAGES = ["verifiers==0.4.0", "openai>=2.54"]


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def ensure_verifiers():
    try:
        import verifiers.v1  # noqa: F401
        return
    except ImportError:
        pass
    if os.path.abspath(sys.executable) == os.path.abspath(VENV_PY):
        fail("the venv has no verifiers package after installing it")
    base = sys.executable
    if sys.version_info < (3, 11):  # verifiers 0.4.0 needs 3.11+
        base = shutil.which("python3.11") or shutil.which("python3.12") or fail("verifiers needs Python >= 3.11")
    os.makedirs(os.path.dirname(VENV), exist_ok=True)
    with open(VENV + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ok = os.path.exists(VENV_PY) and subprocess.run(
            [VENV_PY, "-c", "import verifiers.v1"], capture_output=True).returncode == 0
        if not ok:
            print(f"installing {' '.join(PACKAGES)} into {VENV}", flush=True)
            subprocess.run([base, "-m", "venv", "--clear", VENV], check=True)
            subprocess.run([VENV_PY, "-m", "pip", "install", "-q", *PACKAGES], check=True)
    os.execv(VENV_PY, [VENV_PY] + sys.argv)


class Proc:
    """A child process whose output lines are collected by a thread."""

    def __init__(self, argv, env=None):
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)

    def wait_line(self, needle, timeout=120):
        end = time.time() + timeout
        while time.time() < end:
            for line in list(self.lines):
                if needle in line:
                    return line
            if self.p.poll() is not None and self.t.is_alive() is False:
                break
            time.sleep(0.05)
        self.stop()
        fail(f"no line with {needle!r} from {self.p.args}: {''.join(self.lines)[-3000:]}")

    def text(self):
        return "".join(self.lines)

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.t.join(5)


def start_vf_server(env_extra=None):
    env = dict(os.environ, PYTHONPATH=HERE, **(env_extra or {}))
    serve = os.path.join(HERE, "..", "..", "..", "envs", "python", "verifiers_serve.py")  # what users run
    s = Proc([sys.executable, serve, "--taskset", "troupe_vf_echo", "--harness", "troupe_vf_echo",
              "--address", "tcp://127.0.0.1:0"], env)
    line = s.wait_line("verifiers env server on ")
    return s, line.split(" on ")[1].strip()


TASKS = [{"prompt": f"Say the letter {c}.", "answer": c} for c in "abcdefgh"]


def write_config(tmp, name, model, address, max_steps=2, extra_env=None, eval_every=0):
    env = {"name": "vf", "type": "verifiers", "address": address, "timeout_s": 60, "startup_timeout_s": 30,
           "config": {"tasks": TASKS[:6], "eval_tasks": TASKS[6:]}}
    env.update(extra_env or {})
    cfg = {
        "run": {"name": name, "dir": os.path.join(tmp, name), "seed": 3},
        "policy": {"path": model, "tokenizer": "auto"},
        "rollout": {"serve": "127.0.0.1:0", "serve_slots": 8, "template": "chat", "num_generations": 2,
                    "prompts_per_step": 2, "max_prompt_length": 256, "max_response_length": 6,
                    "temperature": 1.0},
        "grpo": {"max_steps": max_steps},
        "optimizer": {"lr": 1e-4},
        "eval": {"num_prompts": 2, "every": eval_every},
        "checkpointing": {"enabled": False},
        "logger": {"progress": "off", "tensorboard": False},
        "envs": [env],
    }
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)  # JSON is YAML
    return path


def rows(tmp, name):
    with open(os.path.join(tmp, name, "metrics.jsonl")) as f:
        return [json.loads(x) for x in f if x.strip()]


def main():
    ensure_verifiers()
    if sys.argv[1:2] == ["--install-only"]:  # (scripts/setup.sh --test: the venv is made before the tests)
        print("verifiers is installed:", sys.executable)
        return
    troupe, fixture, template = sys.argv[1:4]
    tmp = tempfile.mkdtemp(prefix="troupe-vf-")
    servers = []
    try:
        model = os.path.join(tmp, "model")
        shutil.copytree(fixture, model)
        shutil.copy(template, os.path.join(model, "chat_template.jinja"))
        cfg_path = os.path.join(model, "config.json")
        mc = json.load(open(cfg_path))
        mc["max_position_embeddings"] = 2048  # room for two chat turns (rotary positions: same model)
        json.dump(mc, open(cfg_path, "w"), indent=2)

        # 1. a run against the real server: trained on the served tokens; its tasks are the taskset's
        # own (troupe_vf_echo's load(), through config.taskset: 10 rows, the last 2 held out)
        server, address = start_vf_server()
        servers.append(server)
        t0 = time.time()
        own_tasks = {"config": {"taskset": {"id": "troupe_vf_echo"}, "eval_size": 2, "python": sys.executable},
                     "environment": {"PYTHONPATH": HERE}}
        run = Proc([troupe, "run", write_config(tmp, "ok", model, address, extra_env=own_tasks)])
        line = run.wait_line("rollout.serve listening on ")
        url = line.split("listening on ")[1].split()[0]
        # a request with no episode: served, tagged with the policy version, not recorded
        body = json.dumps({"model": "anything", "prompt": "a", "max_tokens": 2}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            plain = json.loads(r.read())
        tr = plain["choices"][0]["troupe"]
        if tr.get("episode_id") is not None or "policy_version" not in tr:
            fail(f"a request without an episode: {tr}")
        # an episode's own base URL names it too (the coordinator never takes this one: not trained)
        req = urllib.request.Request(url + "/episodes/probe-1/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            tr = json.loads(r.read())["choices"][0]["troupe"]
        if tr.get("episode_id") != "probe-1" or len(tr["completion_token_ids"]) != len(tr["completion_logprobs"]):
            fail(f"a request under /episodes/probe-1/v1: {tr}")
        rc = run.p.wait(300)
        run.t.join(5)
        if rc != 0:
            fail(f"troupe run exited {rc}: {run.text()[-4000:]}")
        steps = [x for x in rows(tmp, "ok") if x.get("phase") == "grpo" and "loss" in x]
        evals = [x for x in rows(tmp, "ok") if "eval_accuracy" in x]
        if len(steps) != 2:
            fail(f"expected 2 GRPO rows, got {steps}")
        for x in steps:
            if x.get("env_failures", 0) != 0:
                fail(f"episodes failed: {x}")
            if not (x.get("mismatch_tokens", 0) > 0 and x["logprob_diff_max"] < 0.05):
                fail(f"the learner did not score the served tokens as sampled: {x}")
            if x.get("response_len_mean", 0) <= 0 or "reward_mean/vf" not in x:
                fail(f"no served response or reward: {x}")
            if "reward_components/vf/contains_answer" not in x:  # the reward's score x weight, per step
                fail(f"no reward component of the verifiers reward: {sorted(x)}")
        if not evals or "eval_reward_mean/vf" not in evals[-1]:
            fail(f"no evaluation of the verifiers env: {evals}")
        logs = glob.glob(os.path.join(tmp, "ok", "logs", "env-vf-tasks-*.log"))
        if len(logs) != 1 or "verifiers_tasks: 10 tasks" not in open(logs[0]).read():
            fail(f"no taskset loader log with its 10 tasks in the run's logs/: {logs}")
        print(f"run ok in {time.time() - t0:.1f}s: mismatch_tokens {[x['mismatch_tokens'] for x in steps]}, "
              f"logprob_diff_max {[x['logprob_diff_max'] for x in steps]}, reward {[x['reward_mean'] for x in steps]}")

        # 1b. the shipped example, configs/verifiers_grpo.yaml, against the same server (the test's small
        # model instead of SmolLM2, one step)
        shipped = os.path.join(HERE, "..", "..", "..", "configs", "verifiers_grpo.yaml")
        p = subprocess.run([troupe, "run", shipped, "--set", f"run.dir={os.path.join(tmp, 'shipped')}",
                            "--set", f"policy.path={model}", "--set", f"envs[0].address={address}",
                            "--set", "grpo.max_steps=1", "--set", "rollout.max_response_length=6",
                            "--set", "eval.num_prompts=2", "--set", "logger.progress=off"],
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            fail(f"configs/verifiers_grpo.yaml exited {p.returncode}: {(p.stdout + p.stderr)[-3000:]}")
        got = [x for x in rows(tmp, "shipped") if x.get("phase") == "grpo" and "loss" in x]
        if len(got) != 1 or "reward_mean/letters" not in got[0]:
            fail(f"configs/verifiers_grpo.yaml: expected one GRPO row of env letters, got {got}")
        print("configs/verifiers_grpo.yaml ran one step")

        # 1c. a model without a chat template: rollout.serve renders the harness's chat requests with
        # the built-in tags (as rollout.template chat does), so a step runs with no failed episode
        bare = os.path.join(tmp, "bare_model")
        shutil.copytree(model, bare)
        os.remove(os.path.join(bare, "chat_template.jinja"))
        p = subprocess.run([troupe, "run", write_config(tmp, "bare", bare, address, max_steps=1)],
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            fail(f"a model without a chat template exited {p.returncode}: {p.stderr[-3000:]}")
        got = [x for x in rows(tmp, "bare") if x.get("phase") == "grpo" and "loss" in x]
        if len(got) != 1 or got[0].get("env_failures", 0) != 0 or got[0].get("response_len_mean", 0) <= 0:
            fail(f"a model without a chat template: expected one GRPO row without failures, got {got}")
        print("a model without a chat template: served with the built-in tags, one step")

        # 2. timeouts: every other episode sleeps past timeout_s; counted, the run continues
        slow, slow_address = start_vf_server({"TROUPE_VF_SLOW_EVERY": "2", "TROUPE_VF_SLEEP_S": "30"})
        servers.append(slow)
        cfg = write_config(tmp, "timeout", model, slow_address, max_steps=1,
                           extra_env={"timeout_s": 4, "max_retries": 0, "max_failure_frac": 0.75})
        p = subprocess.run([troupe, "run", cfg, "--set", "eval.num_prompts=1"], capture_output=True, text=True,
                           timeout=300)
        if p.returncode != 0:
            fail(f"timeout run exited {p.returncode}: {p.stderr[-3000:]}")
        step = [x for x in rows(tmp, "timeout") if x.get("phase") == "grpo" and "loss" in x][0]
        if step.get("env_failures/timeout", 0) < 1:
            fail(f"no timeout counted: {step}")
        print(f"timeout ok: env_failures/timeout {step['env_failures/timeout']} of 4, run went on")

        # 2b. retries run concurrently: every episode sleeps past timeout_s, on every try; the 12
        # episodes' 3 tries each end in about 3 timeouts of wall time (one after another they would
        # take 36), then every episode has failed: exit 3
        hung, hung_address = start_vf_server({"TROUPE_VF_SLOW_EVERY": "1", "TROUPE_VF_SLEEP_S": "60"})
        servers.append(hung)
        cfg = write_config(tmp, "hung", model, hung_address, max_steps=1,
                           extra_env={"timeout_s": 3, "max_retries": 2})
        with open(cfg) as f:
            c = json.load(f)
        c["rollout"]["prompts_per_step"] = 6
        with open(cfg, "w") as f:
            json.dump(c, f)
        t1 = time.time()
        p = subprocess.run([troupe, "run", cfg], capture_output=True, text=True, timeout=300)
        wall = time.time() - t1
        if p.returncode != 3 or "timeout" not in p.stderr or "env 'vf'" not in p.stderr:
            fail(f"hung server: expected exit 3 naming env 'vf' and timeout, got {p.returncode}: {p.stderr[-3000:]}")
        if wall > 60:  # liveness bound, generous: start-up + 3 rounds of 3 s, not 12 x 2 retries x 3 s
            fail(f"hung server: the retries took {wall:.0f} s: they ran one after another")
        print(f"hung server ok: 12 episodes x 3 tries past timeout_s 3 s ended in {wall:.1f} s (exit 3)")

        # 3. a server that answers malformed (not msgpack) or with the wrong schema: protocol_error, exit 3
        for mode in ("garbage", "schema"):
            bad = Proc([sys.executable, os.path.join(HERE, "bad_vf_server.py"), mode])
            servers.append(bad)
            bad_address = bad.wait_line("bad verifiers server on ").split(" on ")[1].strip()
            cfg = write_config(tmp, "bad_" + mode, model, bad_address, max_steps=1,
                               extra_env={"max_retries": 1})
            p = subprocess.run([troupe, "run", cfg], capture_output=True, text=True, timeout=300)
            if p.returncode != 3 or "protocol_error" not in p.stderr or "env 'vf'" not in p.stderr:
                fail(f"{mode} server: expected exit 3 naming env 'vf' and protocol_error, got {p.returncode}: "
                     f"{p.stderr[-3000:]}")
            print(f"{mode} ok: exit 3, {[l for l in p.stderr.splitlines() if 'protocol_error' in l][-1][:200]}")

        # 4. no server at the address: the run stops at start-up
        cfg = write_config(tmp, "down", model, "tcp://127.0.0.1:9", max_steps=1, extra_env={"startup_timeout_s": 2})
        p = subprocess.run([troupe, "run", cfg], capture_output=True, text=True, timeout=120)
        if p.returncode != 3 or "health" not in p.stderr:
            fail(f"server down: expected exit 3 naming health, got {p.returncode}: {p.stderr[-2000:]}")
        print("server down ok: exit 3")

        # 5. a taskset that cannot be loaded stops the start (exit 2), quoting the loader's error
        cfg = write_config(tmp, "no_taskset", model, address, max_steps=1,
                           extra_env={"config": {"taskset": {"id": "no_such_taskset"}, "python": sys.executable}})
        p = subprocess.run([troupe, "run", cfg], capture_output=True, text=True, timeout=120)
        if p.returncode != 2 or "config.taskset" not in p.stderr or "no_such_taskset" not in p.stderr:
            fail(f"unknown taskset: expected exit 2 naming config.taskset, got {p.returncode}: {p.stderr[-2000:]}")
        print("unknown taskset ok: exit 2")
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("envs.verifiers: ok")


if __name__ == "__main__":
    main()
