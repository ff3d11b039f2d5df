#!/usr/bin/env python3
"""launch.serve_auth: `troupe serve` fit for real use, on the tiny Qwen3 fixture (stdlib HTTP only):
API keys (--api-key-file, TROUPE_API_KEY; 401 without a valid bearer key, /health open; exit 2
naming an unreadable or empty keys file or an empty TROUPE_API_KEY), per-request limits (--max-tokens-cap, --max-prompt-tokens:
400 naming the limit; --max-body-bytes: 413), the bounded queue (--max-queue: 429 with Retry-After),
--request-timeout-s (504; streamed: an error event) and the SIGTERM drain (in-flight requests finish, new ones get 503, exit 0).
    check_serve_auth.py TROUPE FIXTURE_MODEL_DIR
A long request is max_tokens 4000 with ignore_eos: about 3 s on one core of the fixture, long enough
to overlap the others; nothing asserts a speed."""
import concurrent.futures
import http.client as http_client
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


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def start(troupe, d, *extra, env=None):
    p = subprocess.Popen([troupe, "serve", d, "--bind", "127.0.0.1:0", "--model-name", "tiny",
                          "--max-context", "4096", "--threads", "1", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    if "listening on http://" not in line:
        p.kill()
        fail(f"troupe serve {extra} did not start: {line!r} {p.stderr.read()}")
    return p, line.split("listening on ")[1].split()[0]


def stop(p):
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=60)
    if rc != 0:
        fail(f"SIGTERM: exit {rc}: {p.stderr.read()}")


def http(url, body=None, key=None, timeout=60, raw=None):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


def completion(tokens=8, prompt="hi", **kw):
    return {"model": "tiny", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, **kw}


def expect_error(got, status, param=None, words=(), what=""):
    st, j, _ = got
    err = j.get("error") or {}
    if st != status or (param is not None and err.get("param") != param) or any(w not in err.get("message", "") for w in words):
        fail(f"{what}: expected {status} (param {param}, naming {words}), got {st} {j}")


def check_keys(troupe, d, tmp):
    rc = subprocess.run([troupe, "serve", d, "--api-key-file", os.path.join(tmp, "none")], capture_output=True, text=True)
    if rc.returncode != 2 or "none" not in rc.stderr or "--api-key-file" not in rc.stderr:
        fail(f"unreadable keys file: expected exit 2 naming it, got {rc.returncode}: {rc.stderr}")
    empty = os.path.join(tmp, "empty.keys")
    open(empty, "w").write("# no key here\n\n")
    rc = subprocess.run([troupe, "serve", d, "--api-key-file", empty], capture_output=True, text=True)
    if rc.returncode != 2 or "empty.keys" not in rc.stderr:
        fail(f"empty keys file: expected exit 2 naming it, got {rc.returncode}: {rc.stderr}")
    rc = subprocess.run([troupe, "serve", d], capture_output=True, text=True, env=dict(os.environ, TROUPE_API_KEY=" "))
    if rc.returncode != 2 or "TROUPE_API_KEY" not in rc.stderr:
        fail(f"empty TROUPE_API_KEY: expected exit 2 naming it, got {rc.returncode}: {rc.stderr}")
    keys = os.path.join(tmp, "api.keys")
    open(keys, "w").write("# production keys\nsk-first-key\n\n   sk-second-key  \n")
    p, url = start(troupe, d, "--api-key-file", keys)
    try:
        for key in (None, "", "sk-first", "sk-first-keyX", "sk-third-key", "# production keys"):
            got = http(url + "/v1/completions", completion(), key=key)
            expect_error(got, 401, what=f"key {key!r}")
            if got[1]["error"].get("code") != "invalid_api_key" or got[2].get("WWW-Authenticate") != "Bearer":
                fail(f"401 shape: {got}")
        expect_error(http(url + "/v1/models"), 401, what="/v1/models without a key")
        # A 401 is answered before the body is read: the connection closes, and a client that keeps
        # connections alive (http.client here, httpx in the openai package) sends the next request afresh.
        conn = http_client.HTTPConnection(url.replace("http://", ""), timeout=60)
        for key, want in (("sk-wrong", 401), ("sk-first-key", 200), ("sk-first-key", 200)):
            conn.request("POST", "/v1/completions", json.dumps(completion()), {"Authorization": f"Bearer {key}"})
            r = conn.getresponse()
            r.read()
            if r.status != want or (want == 401 and r.getheader("Connection") != "close"):
                fail(f"kept-alive connection, key {key}: {r.status} {r.getheaders()}")
        for key in ("sk-first-key", "sk-second-key"):
            st, j, _ = http(url + "/v1/completions", completion(), key=key)
            if st != 200 or j["usage"]["completion_tokens"] != 8:
                fail(f"key {key}: {st} {j}")
        st, h, _ = http(url + "/health")
        if st != 200 or h.get("status") != "ok":
            fail(f"/health needs no key: {st} {h}")
    finally:
        stop(p)
    env = dict(os.environ, TROUPE_API_KEY="sk-from-env")
    p, url = start(troupe, d, env=env)
    try:
        expect_error(http(url + "/v1/completions", completion(), key="sk-first-key"), 401, what="TROUPE_API_KEY, wrong key")
        if http(url + "/v1/completions", completion(), key="sk-from-env")[0] != 200:
            fail("TROUPE_API_KEY: its key was refused")
    finally:
        stop(p)
    print("api keys: 401 without a valid bearer key, both keys of the file and TROUPE_API_KEY accepted")


def check_limits(troupe, d):
    p, url = start(troupe, d, "--max-tokens-cap", "32", "--max-prompt-tokens", "20", "--max-body-bytes", "2048")
    try:
        expect_error(http(url + "/v1/completions", completion(tokens=33)), 400, "max_tokens", ["--max-tokens-cap", "32"],
                     "max_tokens over the cap")
        st, j, _ = http(url + "/v1/completions", completion(tokens=32))
        if st != 200 or j["usage"]["completion_tokens"] != 32:
            fail(f"max_tokens at the cap: {st} {j}")
        st, j, _ = http(url + "/v1/completions", completion(tokens=None, prompt="x", ignore_eos=True))
        if st != 200:
            fail(f"no max_tokens: {st} {j}")
        expect_error(http(url + "/v1/completions", completion(prompt="word " * 30)), 400, "prompt",
                     ["--max-prompt-tokens", "20"], "a long prompt")
        expect_error(http(url + "/v1/completions", raw=json.dumps(completion(prompt="y" * 4000)).encode()), 413,
                     words=["--max-body-bytes", "2048"], what="a large body")
        big_chat = {"model": "tiny", "messages": [{"role": "user", "content": "z" * 4000}], "max_tokens": 2}
        expect_error(http(url + "/v1/chat/completions", raw=json.dumps(big_chat).encode()), 413,
                     words=["--max-body-bytes", "2048"], what="a large chat body (413, not 400)")
        expect_error(http(url + "/v1/completions", completion(foo=1)), 400, "foo", what="an unknown field")
        if http(url + "/v1/completions", completion(user="u1", seed=3))[0] != 200:
            fail("user and seed must be accepted")
    finally:
        stop(p)
    print("limits: max_tokens cap and prompt length 400 naming the flag, body size 413")


def check_queue_and_timeout(troupe, d):
    p, url = start(troupe, d, "--max-batch", "1", "--max-queue", "1", "--request-timeout-s", "60")
    try:
        def one(i):
            return http(url + "/v1/completions", completion(tokens=4000, prompt=f"q{i}"), timeout=120)
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            got = list(ex.map(one, range(6)))
        codes = sorted(g[0] for g in got)
        if codes.count(200) < 2 or codes.count(429) < 1 or set(codes) - {200, 429}:
            fail(f"6 long requests against 1 slot + a queue of 1: {codes}")
        for st, j, h in got:
            if st == 429 and (h.get("Retry-After") != "1" or "--max-queue" not in j["error"]["message"]):
                fail(f"429 shape: {j} {h}")
            if st == 200 and j["usage"]["completion_tokens"] != 4000:
                fail(f"an admitted request was cut short: {j['usage']}")
        print(f"queue: {codes.count(200)} served, {codes.count(429)} answered 429 with Retry-After")
    finally:
        stop(p)
    p, url = start(troupe, d, "--request-timeout-s", "0.5")
    try:
        t0 = time.time()
        expect_error(http(url + "/v1/completions", completion(tokens=4000)), 504, words=["--request-timeout-s"],
                     what="a request past the timeout")
        if time.time() - t0 > 20:
            fail(f"the timed-out request took {time.time() - t0:.1f} s")
        req = urllib.request.Request(url + "/v1/completions", data=json.dumps(completion(tokens=4000, stream=True)).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            events = r.read().decode(errors="replace")
        if '"code":"timeout"' not in events or "[DONE]" in events:
            fail(f"a streamed request past the timeout: no timeout error event: {events[-300:]!r}")
        if http(url + "/v1/completions", completion(tokens=8))[0] != 200:
            fail("a short request after a timeout failed")
    finally:
        stop(p)
    print("request timeout: 504, the server serves on")


def check_drain(troupe, d):
    for _ in range(5):  # a signal right at start-up (as the listening line is printed) stops it too
        p, _ = start(troupe, d)
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            fail("SIGTERM at start-up: the server did not stop")
        if rc != 0:
            fail(f"SIGTERM at start-up: exit {rc}")
    p, url = start(troupe, d)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        long = ex.submit(http, url + "/v1/completions", completion(tokens=4000), None, 120)
        for _ in range(200):  # until the request runs
            if http(url + "/health")[1].get("engine_steps", 0) > 0:
                break
            time.sleep(0.02)
        p.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        if p.poll() is None:
            try:
                expect_error(http(url + "/v1/completions", completion()), 503, what="a request while draining")
            except (urllib.error.URLError, ConnectionError) as e:
                fail(f"a request while draining was not answered 503: {e}")
        st, j, _ = long.result()
        if st != 200 or j["usage"]["completion_tokens"] != 4000:
            fail(f"the request in flight at SIGTERM did not finish: {st} {j}")
    rc = p.wait(timeout=60)
    if rc != 0:
        fail(f"drained server: exit {rc}")
    print("SIGTERM: the request in flight finished (4000 tokens), a new one got 503, exit 0")


def main():
    troupe, fixture = sys.argv[1:3]
    tmp = tempfile.mkdtemp(prefix="troupe-serve-auth-")
    try:
        d = os.path.join(tmp, "model")
        shutil.copytree(fixture, d)
        cfg_path = os.path.join(d, "config.json")
        cfg = json.load(open(cfg_path))
        cfg["max_position_embeddings"] = 4096  # rotary positions: a longer context is the same model
        json.dump(cfg, open(cfg_path, "w"))
        check_keys(troupe, d, tmp)
        check_limits(troupe, d)
        check_queue_and_timeout(troupe, d)
        check_drain(troupe, d)
        print("launch.serve_auth: ok")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
