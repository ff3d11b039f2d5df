#!/usr/bin/env python3
"""Load test of `troupe serve` on 127.0.0.1 (stdlib only): a bounded number of client threads send
chat completions back to back for a while against a server started with an API key and its
default limits; reports p50/p99 latency, requests/s, errors by status and the server's peak RSS
(VmHWM from /proc). docs/serving.md has the figures of a run by hand; launch.serve_auth_load runs
a short version and asserts only zero errors and a bounded peak RSS (no speed assertion).
    serve_load.py TROUPE MODEL [--clients 16] [--seconds 20] [--max-tokens 32] [--template JINJA]
                  [--max-rss-mib N]   (exit 1 on any error, or when the peak RSS exceeds N)"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

KEY = "sk-load-test"


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("troupe")
    ap.add_argument("model")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--template", help="a chat template to copy into (a copy of) the model directory")
    ap.add_argument("--max-rss-mib", type=float, default=0)
    ap.add_argument("--serve-args", default="", help="extra `troupe serve` arguments, space-separated")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="troupe-serve-load-")
    model = a.model
    if a.template:
        model = os.path.join(tmp, "model")
        shutil.copytree(a.model, model)
        shutil.copy(a.template, os.path.join(model, "chat_template.jinja"))
    server = subprocess.Popen([a.troupe, "serve", model, "--bind", "127.0.0.1:0", "--model-name", "m",
                               *a.serve_args.split()],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, TROUPE_API_KEY=KEY))
    try:
        line = server.stdout.readline()
        if "listening on http://" not in line:
            print(f"FAIL: troupe serve did not start: {line!r} {server.stderr.read()}", file=sys.stderr)
            return 1
        url = line.split("listening on ")[1].split()[0] + "/v1/chat/completions"
        lat, errors, tokens = [], {}, [0]
        lock = threading.Lock()
        stop_at = time.time() + a.seconds

        def client(i):
            n = 0
            while time.time() < stop_at:
                body = json.dumps({"model": "m", "max_tokens": a.max_tokens, "temperature": 1, "seed": i * 100000 + n,
                                   "messages": [{"role": "user", "content": f"Question {n} from client {i}?"}]}).encode()
                req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json",
                                                                      "Authorization": f"Bearer {KEY}"})
                t0 = time.perf_counter()
                try:
                    with urllib.request.urlopen(req, timeout=600) as r:
                        j = json.loads(r.read())
                    status = 200
                except urllib.error.HTTPError as e:
                    status = e.code
                except Exception as e:  # connection reset, timeout
                    status = type(e).__name__
                dt = time.perf_counter() - t0
                with lock:
                    if status == 200:
                        lat.append(dt)
                        tokens[0] += j["usage"]["completion_tokens"]
                    else:
                        errors[status] = errors.get(status, 0) + 1
                n += 1

        t0 = time.time()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
        for t in threads:
            t.start()
        peak = 0
        while any(t.is_alive() for t in threads):
            peak = max(peak, peak_rss_kib(server.pid))
            time.sleep(0.2)
        wall = time.time() - t0
        peak = max(peak, peak_rss_kib(server.pid))
        lat.sort()
        pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else float("nan")  # noqa: E731
        report = {"clients": a.clients, "seconds": round(wall, 1), "requests": len(lat),
                  "errors": sum(errors.values()), "errors_by_status": {str(k): v for k, v in errors.items()},
                  "requests_per_s": round(len(lat) / wall, 2), "completion_tokens_per_s": round(tokens[0] / wall, 1),
                  "p50_s": round(pct(0.50), 3), "p99_s": round(pct(0.99), 3), "max_s": round(lat[-1], 3) if lat else None,
                  "server_peak_rss_mib": round(peak / 1024, 1), "max_tokens": a.max_tokens}
        print(json.dumps(report))
        server.send_signal(signal.SIGTERM)
        rc = server.wait(timeout=120)
        if rc != 0:
            print(f"FAIL: SIGTERM: exit {rc}", file=sys.stderr)
            return 1
        if report["errors"] or not lat:
            print(f"FAIL: {report['errors']} errors, {len(lat)} requests served", file=sys.stderr)
            return 1
        if a.max_rss_mib and report["server_peak_rss_mib"] > a.max_rss_mib:
            print(f"FAIL: peak RSS {report['server_peak_rss_mib']} MiB > {a.max_rss_mib} MiB", file=sys.stderr)
            return 1
        return 0
    finally:
        if server.poll() is None:
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
