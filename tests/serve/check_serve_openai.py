#!/usr/bin/env python3
"""launch.serve_openai_client: `troupe serve` on a tiny Qwen3 model directory (tests/hf_fixture/qwen3 with
the Qwen3 chat template, an API key from TROUPE_API_KEY), driven by the official `openai` Python
client: a wrong key (AuthenticationError), an unknown model (NotFoundError), models, completions and
chat (plain, streamed, logprobs, stop strings, n, tools rendered by the template), the troupe
extension field (prompt and completion token ids and log-probs), determinism (same seed -> same
tokens; temperature 0 and seeded sampling equal `troupe generate`), 16 concurrent requests batched
by the engine, log-prob entries as many as completion_tokens, and 400s naming the field for bad
requests (unknown fields, a json_schema keyword outside the supported subset, tool_choice required)
while the server stays up; response_format json_object and json_schema replies are JSON objects /
documents the schema admits (constrained decoding).
    check_serve_openai.py TROUPE FIXTURE_MODEL_DIR QWEN3_TEMPLATE
The `openai` package is installed on first use into a venv under $TROUPE_CACHE (default
~/.cache/troupe)/venv-openai; the script then re-runs itself with that venv's python."""
import concurrent.futures
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

VENV = os.path.join(os.environ.get("TROUPE_CACHE", os.path.expanduser("~/.cache/troupe")), "venv-openai")
VENV_PY = os.path.join(VENV, "bin", "python")


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def ensure_openai():
    try:
        import openai  # noqa: F401
        return
    except ImportError:
        pass
    if os.path.abspath(sys.executable) == os.path.abspath(VENV_PY):
        fail("the venv has no openai package after installing it")
    os.makedirs(os.path.dirname(VENV), exist_ok=True)
    with open(VENV + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ok = os.path.exists(VENV_PY) and subprocess.run(
            [VENV_PY, "-c", "import openai"], capture_output=True).returncode == 0
        if not ok:
            print(f"installing openai into {VENV}", flush=True)
            subprocess.run([sys.executable, "-m", "venv", "--clear", VENV], check=True)
            subprocess.run([VENV_PY, "-m", "pip", "install", "-q", "openai"], check=True)
    os.execv(VENV_PY, [VENV_PY] + sys.argv)


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)
    return p.returncode, p.stdout, p.stderr


def troupe_generate(troupe, d, *args):
    rc, out, err = run([troupe, "generate", d, "--json", *args])
    if rc != 0:
        fail(f"troupe generate {args}: exit {rc}: {err}")
    return json.loads(out.strip().splitlines()[-1])


API_KEY = "sk-troupe-test"


def start_server(troupe, d, *extra):
    p = subprocess.Popen([troupe, "serve", d, "--bind", "127.0.0.1:0", "--model-name", "tiny", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, TROUPE_API_KEY=API_KEY))
    line = p.stdout.readline()
    if "listening on http://" not in line:
        p.kill()
        fail(f"troupe serve did not start: {line!r} {p.stderr.read()}")
    url = line.split("listening on ")[1].split()[0]
    return p, url


def http(url, body=None, method=None):
    req = urllib.request.Request(url, data=body if body is None or isinstance(body, bytes) else body.encode(),
                                 method=method, headers={"Content-Type": "application/json",
                                                         "Authorization": f"Bearer {API_KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def troupe_of(choice):
    extra = getattr(choice, "model_extra", None) or {}
    t = extra.get("troupe") or getattr(choice, "troupe", None)
    if not t:
        fail(f"choice lacks the troupe field: {choice}")
    return t


def main():
    ensure_openai()
    import openai

    troupe, fixture, template = sys.argv[1:4]
    tmp = tempfile.mkdtemp(prefix="troupe-serve-")
    server = None
    try:
        d = os.path.join(tmp, "model")
        shutil.copytree(fixture, d)
        shutil.copy(template, os.path.join(d, "chat_template.jinja"))
        # Qwen3's tool preamble alone is ~600 byte-level tokens: give the random fixture room for it
        # (rotary positions have no learned table, so a longer context is the same model).
        cfg_path = os.path.join(d, "config.json")
        cfg = json.load(open(cfg_path))
        cfg["max_position_embeddings"] = 2048
        json.dump(cfg, open(cfg_path, "w"), indent=2)

        # CLI errors: exit 2 naming the input.
        rc, _, err = run([troupe, "serve", d, "--bind", "localhost"])
        if rc != 2 or "--bind" not in err:
            fail(f"bad --bind: expected exit 2 naming --bind, got {rc}: {err}")
        rc, _, err = run([troupe, "serve", os.path.join(tmp, "nope"), "--bind", "127.0.0.1:0"])
        if rc != 2:
            fail(f"missing model: expected exit 2, got {rc}: {err}")

        server, url = start_server(troupe, d, "--max-batch", "16", "--max-context", "1024")
        base = url + "/v1"
        client = openai.OpenAI(base_url=base, api_key=API_KEY, max_retries=0, timeout=60)
        try:
            openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0).models.list()
            fail("a wrong API key was accepted")
        except openai.AuthenticationError as e:
            if e.status_code != 401:
                fail(f"wrong key: {e}")
        st, h = http(url + "/health")
        if st != 200 or h.get("status") != "ok":
            fail(f"/health: {st} {h}")
        models = [m.id for m in client.models.list().data]
        if models != ["tiny"]:
            fail(f"/v1/models lists {models}")

        # Greedy completion == `troupe generate --temperature 0`, logprobs included.
        g = troupe_generate(troupe, d, "--prompt", "hello world", "--max-tokens", "12", "--temperature", "0")
        c = client.completions.create(model="tiny", prompt="hello world", max_tokens=12, temperature=0, logprobs=3)
        t = troupe_of(c.choices[0])
        if t["prompt_token_ids"] != g["prompt_tokens"] or t["completion_token_ids"] != g["tokens"]:
            fail(f"greedy completion {t} != troupe generate {g}")
        if max(abs(a - b) for a, b in zip(t["completion_logprobs"], g["logprobs"])) > 1e-5:
            fail(f"logprobs differ: {t['completion_logprobs']} vs {g['logprobs']}")
        if c.choices[0].text != g["text"]:
            fail(f"text {c.choices[0].text!r} != {g['text']!r}")
        lp = c.choices[0].logprobs
        # top_logprobs maps token text to log-prob: tokens with the same text share a key.
        if len(lp.token_logprobs) != c.usage.completion_tokens or any(not 1 <= len(x) <= 3 for x in lp.top_logprobs):
            fail(f"completion logprobs shape: {lp}")
        if c.usage.completion_tokens != len(g["tokens"]) or c.usage.prompt_tokens != len(g["prompt_tokens"]):
            fail(f"usage {c.usage}")
        print(f"greedy completion == troupe generate: {g['tokens']}")

        # Seeded sampling: the same seed samples the same tokens, and what `troupe generate --seed` samples.
        g7 = troupe_generate(troupe, d, "--prompt", "abc", "--max-tokens", "16", "--temperature", "1", "--seed", "7")
        a = client.completions.create(model="tiny", prompt="abc", max_tokens=16, temperature=1, seed=7)
        b = client.completions.create(model="tiny", prompt="abc", max_tokens=16, temperature=1, seed=7)
        ta, tb = troupe_of(a.choices[0]), troupe_of(b.choices[0])
        if ta["completion_token_ids"] != tb["completion_token_ids"]:
            fail("same seed, different tokens")
        if ta["completion_token_ids"] != g7["tokens"]:
            fail(f"seed 7: {ta['completion_token_ids']} != troupe generate {g7['tokens']}")
        other = client.completions.create(model="tiny", prompt="abc", max_tokens=16, temperature=1, seed=8)
        if troupe_of(other.choices[0])["completion_token_ids"] == ta["completion_token_ids"]:
            fail("seeds 7 and 8 sampled the same 16 tokens")
        print("seeded sampling is deterministic and equals troupe generate --seed 7")

        # Chat: the template renders the prompt; logprobs, top_logprobs, the troupe field.
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
        ch = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0.8, seed=3,
                                            logprobs=True, top_logprobs=2)
        t = troupe_of(ch.choices[0])
        msg_file = os.path.join(tmp, "msgs.json")
        json.dump(msgs, open(msg_file, "w"))
        gm = troupe_generate(troupe, d, "--messages", msg_file, "--max-tokens", "1")
        if t["prompt_token_ids"] != gm["prompt_tokens"]:
            fail("chat prompt tokens differ from the template's rendering (troupe generate --messages)")
        content = ch.choices[0].logprobs.content
        if len(content) != ch.usage.completion_tokens or len(content) != len(t["completion_token_ids"]):
            fail(f"{len(content)} logprob entries for {ch.usage.completion_tokens} completion tokens")
        for e, l in zip(content, t["completion_logprobs"]):
            if abs(e.logprob - l) > 1e-6 or len(e.top_logprobs) != 2 or e.top_logprobs[0].logprob < e.top_logprobs[1].logprob:
                fail(f"logprob entry {e} vs {l}")
        if ch.choices[0].finish_reason not in ("stop", "length"):
            fail(f"finish_reason {ch.choices[0].finish_reason}")
        print(f"chat: {len(t['prompt_token_ids'])} prompt tokens, completion {t['completion_token_ids']}")

        # Streaming: the deltas add up to the non-streamed reply of the same seed; usage chunk; troupe field.
        full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=20, temperature=1, seed=11)
        text, finish, tr, usage = "", None, None, None
        for chunk in client.chat.completions.create(model="tiny", messages=msgs, max_tokens=20, temperature=1,
                                                    seed=11, stream=True, stream_options={"include_usage": True}):
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
                extra = getattr(c, "model_extra", None) or {}
                tr = extra.get("troupe", tr)
        if text != full.choices[0].message.content or finish != full.choices[0].finish_reason:
            fail(f"stream {text!r}/{finish} != {full.choices[0].message.content!r}/{full.choices[0].finish_reason}")
        if not tr or tr["completion_token_ids"] != troupe_of(full.choices[0])["completion_token_ids"]:
            fail(f"stream troupe field {tr}")
        if not usage or usage.completion_tokens != len(tr["completion_token_ids"]):
            fail(f"stream usage {usage}")
        stext = ""
        for chunk in client.completions.create(model="tiny", prompt="hello world", max_tokens=12, temperature=0,
                                               stream=True):
            stext += chunk.choices[0].text
        if stext != g["text"]:
            fail(f"streamed completion {stext!r} != {g['text']!r}")
        print(f"streaming: {len(text)} chars match the non-streamed reply")

        # Stop strings end the text before them.
        whole = client.completions.create(model="tiny", prompt="hello world", max_tokens=12, temperature=0,
                                          extra_body={"ignore_eos": True}).choices[0].text
        if len(whole) >= 4:
            stop = whole[2:4]
            s = client.completions.create(model="tiny", prompt="hello world", max_tokens=12, temperature=0,
                                          stop=[stop], extra_body={"ignore_eos": True})
            want = whole[:whole.find(stop)]
            if s.choices[0].text != want or s.choices[0].finish_reason != "stop":
                fail(f"stop {stop!r}: {s.choices[0].text!r}/{s.choices[0].finish_reason}, want {want!r}")
            print(f"stop string {stop!r}: ok")

        # n choices: stream i of the seed; ignore_eos makes max_tokens exact.
        nn = client.completions.create(model="tiny", prompt="abc", max_tokens=16, temperature=1, seed=7, n=2,
                                       extra_body={"ignore_eos": True})
        ids = [troupe_of(x)["completion_token_ids"] for x in nn.choices]
        if len(ids) != 2 or ids[0] == ids[1] or any(len(x) != 16 for x in ids):
            fail(f"n=2: {ids}")
        if ids[0][:len(g7["tokens"])] != g7["tokens"]:
            fail("n=2: choice 0 is not seed 7's first stream")

        # Tools reach the template (the Qwen3 template lists them in the system turn).
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                   "parameters": {"type": "object",
                                                                  "properties": {"city": {"type": "string"}}}}}]
        tc = client.chat.completions.create(model="tiny", messages=msgs, tools=tools, max_tokens=4, temperature=0)
        tool_file = os.path.join(tmp, "tools.json")
        json.dump({"messages": msgs, "tools": tools}, open(tool_file, "w"))
        gt = troupe_generate(troupe, d, "--messages", tool_file, "--max-tokens", "1")
        if troupe_of(tc.choices[0])["prompt_token_ids"] != gt["prompt_tokens"]:
            fail("tools: prompt differs from the template's rendering with tools")
        if len(gt["prompt_tokens"]) <= len(gm["prompt_tokens"]):
            fail("tools: the prompt did not grow")
        # A conversation with an earlier tool call and its result renders too.
        hist = msgs + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny"}]
        client.chat.completions.create(model="tiny", messages=hist, tools=tools, max_tokens=4, temperature=0)
        print("tools rendered through the chat template")

        # Bad requests: 400 naming the field; the server stays up.
        for body, param in [("{not json", None),
                            (json.dumps({"model": "tiny", "prompt": "x", "best_of": 2}), "best_of"),
                            (json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 0}), "max_tokens"),
                            (json.dumps({"model": "tiny", "prompt": " ".join(str(i) for i in range(400))}), "prompt"),
                            (json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 10000}), "max_tokens"),
                            (json.dumps({"model": "tiny", "prompt": "x", "temperature": -1}), "temperature"),
                            (json.dumps({"model": "tiny", "prompt": [1, 99999]}), "prompt"),
                            (json.dumps({"model": "tiny", "messages": []}), "messages")]:
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            st, j = http(url + path, body)
            if st != 400 or "error" not in j or (param and j["error"].get("param") != param):
                fail(f"{body[:60]}: expected 400 naming {param}, got {st} {j}")
        try:
            client.chat.completions.create(model="nope", messages=msgs, max_tokens=2)
            fail("unknown model accepted")
        except openai.NotFoundError as e:
            if "nope" not in str(e) or e.code != "model_not_found":
                fail(f"unknown model error does not name it: {e}")
        # What the server does not implement is refused by name, never ignored.
        for kw, param in [({"extra_body": {"foo": 1}}, "foo"),
                          ({"tool_choice": "required", "tools": tools}, "tool_choice"),
                          ({"frequency_penalty": 0.5}, "frequency_penalty")]:
            try:
                client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, **kw)
                fail(f"{kw} accepted")
            except openai.BadRequestError as e:
                if e.param != param:
                    fail(f"{kw}: the 400 names {e.param}, not {param}: {e}")
        try:
            client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {
                    "type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}}}})
            fail("response_format json_schema with a pattern accepted")
        except openai.BadRequestError as e:
            if e.param != "response_format" or "schema.properties.a.pattern" not in str(e):
                fail(f"json_schema pattern: {e}")
        # response_format json_schema: the stopped replies are documents the schema admits.
        schema = {"type": "object", "properties": {"age": {"type": "integer"}, "ok": {"type": "boolean"},
                                                   "color": {"enum": ["red", "green", None]},
                                                   "xs": {"type": "array", "items": {"type": "number"}}},
                  "required": ["age", "ok"], "additionalProperties": False}
        stopped = 0
        for seed in range(1, 9):
            r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=300, seed=seed,
                                               response_format={"type": "json_schema",
                                                                "json_schema": {"name": "p", "schema": schema}})
            if r.choices[0].finish_reason != "stop":
                continue
            doc = json.loads(r.choices[0].message.content)
            if (set(doc) - set(schema["properties"]) or not {"age", "ok"} <= set(doc)
                    or type(doc["age"]) is not int or type(doc["ok"]) is not bool
                    or doc.get("color", "red") not in ("red", "green", None)
                    or any(type(x) not in (int, float) for x in doc.get("xs", []))):
                fail(f"json_schema seed {seed}: {doc} does not match the schema")
            stopped += 1
        if stopped == 0:
            fail("json_schema: no seed of 8 closed its object within 300 tokens")
        print(f"response_format json_schema: {stopped} of 8 replies closed, each admitted by the schema")
        # response_format json_object: constrained decoding keeps every reply a JSON-object prefix, whole
        # when it stopped (the random fixture rambles inside strings; some seeds close the object).
        stopped = 0
        for seed in range(1, 9):
            r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=300, seed=seed,
                                               response_format={"type": "json_object"})
            text = r.choices[0].message.content
            if not text.lstrip().startswith("{"):
                fail(f"json_object seed {seed}: {text!r}")
            if r.choices[0].finish_reason == "stop":
                if not isinstance(json.loads(text), dict):
                    fail(f"json_object seed {seed}: not an object: {text!r}")
                stopped += 1
        if stopped == 0:
            fail("json_object: no seed of 8 closed its object within 300 tokens")
        print(f"response_format json_object: {stopped} of 8 replies closed a valid JSON object, the rest a prefix")
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, user="u", seed=1, n=1,
                                       frequency_penalty=0, presence_penalty=0, parallel_tool_calls=True)
        st, j = http(url + "/v1/nothing", "{}")
        if st != 404 or "error" not in j:
            fail(f"unknown route: {st} {j}")
        print("bad requests: 400 with the field named")

        # Concurrency: 16 requests at once are batched (the engine stepped several sequences together).
        # Each is long enough (160 tokens) to still run while the client's other threads send theirs:
        # the tiny model finishes a short request before Python has started the next thread.
        def one(i):
            r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"q{i}"}],
                                               max_tokens=160, temperature=1, seed=i, extra_body={"ignore_eos": True})
            return len(troupe_of(r.choices[0])["completion_token_ids"])
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            lens = list(ex.map(one, range(16)))
        if lens != [160] * 16:
            fail(f"concurrent completions: {lens}")
        st, h = http(url + "/health")
        if h.get("peak_batch", 0) < 4:
            fail(f"16 concurrent requests were not batched: {h}")
        print(f"16 concurrent chat requests in {time.time() - t0:.2f}s, peak batch {h['peak_batch']}")

        server.send_signal(signal.SIGTERM)
        rc = server.wait(timeout=30)
        if rc != 0:
            fail(f"SIGTERM: exit {rc}: {server.stderr.read()}")
        server = None
        print("launch.serve_openai_client: ok")
    finally:
        if server is not None:
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
