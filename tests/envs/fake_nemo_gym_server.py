#!/usr/bin/env python3
"""A NeMo Gym resource server written from its HTTP contract with the standard library only, that
misbehaves on purpose (for the nemo_gym env's run-level failure tests). Rows carry "answer"; the
reward is 1 when the output's assistant text or a function call's arguments contain it.

  fake_nemo_gym_server.py --port-file PATH | --port PORT [--fault KIND --every N]

GET / answers {"status": "ok"}; /seed_session sets a session cookie; /verify answers the row with
"reward" (and reward_components {"found": 0|1}, and the extra field "judge_score"); /aggregate_metrics answers agent_metrics
{"mean/reward", "count"}. On every Nth /verify it does KIND: http500, not_json, no_reward (no
"reward" key) or slow (answers after 2 s). The port it bound is written to --port-file. At start it
prints its cwd, $FAKE_MARK and $TROUPE_NEMO_GYM_SERVER_CONFIG to stdout."""
import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--port-file", default="")
p.add_argument("--port", type=int, default=0)  # troupe's {port} (a server troupe starts)
p.add_argument("--fault", default="none")
p.add_argument("--every", type=int, default=0)
args = p.parse_args()
lock = threading.Lock()
count = {"verify": 0}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def answer(self, status, body, cookie=None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if cookie:
            self.send_header("Set-Cookie", cookie)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.answer(200, {"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/seed_session":
            return self.answer(200, {}, "fake_session=s1; path=/; httponly")
        if self.path == "/aggregate_metrics":
            rs = [r.get("reward", 0) for r in body.get("verify_responses", [])]
            return self.answer(200, {"agent_metrics": {"mean/reward": sum(rs) / max(1, len(rs)), "count": len(rs)},
                                     "key_metrics": {}, "group_level_metrics": []})
        if self.path != "/verify":
            return self.answer(404, {"detail": "Not Found"})
        with lock:
            count["verify"] += 1
            n = count["verify"]
        fault = args.fault if args.every and n % args.every == 0 else "none"
        if fault == "slow":
            time.sleep(2)
        if fault == "http500":
            return self.answer(500, {"detail": "verifier crashed"})
        if fault == "not_json":
            return self.answer(200, b"<html>not json</html>")
        text = ""
        for item in body["response"]["output"]:
            if item.get("type") == "message":
                text += "".join(c.get("text", "") for c in item.get("content", []))
            elif item.get("type") == "function_call":
                text += item.get("arguments", "")
        found = 1.0 if str(body.get("answer", "")) and str(body["answer"]) in text else 0.0
        out = {k: v for k, v in body.items()}
        if fault != "no_reward":
            out["reward"] = found
            out["reward_components"] = {"found": found}
            out["judge_score"] = found  # an extra field: troupe keeps it in the turn's info.fields
        self.answer(200, out)


class Server(ThreadingHTTPServer):
    request_queue_size = 256  # troupe sends each step's calls at once
    daemon_threads = True


srv = Server(("127.0.0.1", args.port), Handler)
import os  # noqa: E402
# what a server troupe starts sees (envs.nemo_gym_run reads it back from the run's logs/)
print(f"fake server: cwd={os.getcwd()} FAKE_MARK={os.environ.get('FAKE_MARK', '')} "
      f"server_config={os.environ.get('TROUPE_NEMO_GYM_SERVER_CONFIG', '')}", flush=True)
if args.port_file:
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.replace(args.port_file + ".tmp", args.port_file)
srv.serve_forever()
