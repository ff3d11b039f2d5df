"""A scripted OpenAI-compatible judge for envs.judge_run: POST /v1/chat/completions answers
"Score: N" (N = the byte sum of the graded response mod 11) for a user message "R:<response>";
for "G:<response>" a response whose byte sum is divisible by 4 gets a reply with no score; for
"H:<response>" one whose byte sum is divisible by 31 gets its answer only after 3 s (a hung judge).
A request without "Authorization: Bearer $JUDGE_KEY" gets 401. Writes its port to PORT_FILE.
  fake_judge_server.py PORT_FILE
"""
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.path != "/v1/chat/completions":
            return self.answer(404, {"error": "no route " + self.path})
        if self.headers.get("Authorization") != "Bearer " + os.environ["JUDGE_KEY"]:
            return self.answer(401, {"error": "bad key"})
        msg = body["messages"][0]["content"]
        mode, response = msg[:2], msg[2:]
        total = sum(response.encode())
        content = f"Score: {total % 11}"
        if mode == "G:" and total % 4 == 0:
            content = "I would rather not say."
        if mode == "H:" and total % 31 == 0:
            time.sleep(3)
        self.answer(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
                          "model": body["model"]})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
server.serve_forever()
