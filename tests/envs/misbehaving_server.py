#!/usr/bin/env python3
"""A remote env (troupe.env/1) written from envs/PROTOCOL.md with plain pyzmq, that misbehaves on
purpose. It answers each request on a thread of its own (ROUTER socket), so one hung request does
not hold up the others. Tiny addition task: reset(seed) -> "a+b=", verify -> 1 for the sum.

  misbehaving_server.py --bind ADDR [--fault KIND --op OP --every N] [--count-file PATH]

On every Nth request of OP (reset, verify, step) it does KIND: hang (never answers), slow (answers
after 0.3 s), wrong_id, extra_frames, bad_utf8, not_json, error (an error reply), bigreward
(verify: reward 1e308), nan (a NaN, which is not JSON). With --count-file it writes how many
requests of each op it answered (one JSON object, rewritten after each request).
"""
import argparse
import json
import os
import queue
import threading
import time

import zmq

p = argparse.ArgumentParser()
p.add_argument("--bind", default=os.environ.get("TROUPE_ENV_BIND", "tcp://127.0.0.1:5555"))
p.add_argument("--fault", default="none")
p.add_argument("--op", default="verify")
p.add_argument("--every", type=int, default=0)
p.add_argument("--count-file", default="")
args = p.parse_args()

ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.bind(args.bind)
out = queue.Queue()
lock = threading.Lock()
calls = {}
answered = {}


def task(seed):
    a, b = seed % 5, (seed // 5) % 5
    return f"{a}+{b}=", str(a + b)


def result(req):
    op = req.get("op")
    if op == "hello":
        return {"protocol": "troupe.env/1",
                "env": {"name": "misbehaving", "version": "2.5", "multi_turn": False, "max_turns": 1, "tools": []}}
    if op == "reset":
        text, answer = task(int(req["seed"]))
        return {"text": text, "messages": [{"role": "user", "content": text}],
                "metadata": {"answer": answer, "reference_completion": answer}}
    if op == "verify":
        ok = str(req.get("completion", "")).strip() == req["metadata"].get("answer")
        return {"reward": 1.0 if ok else 0.0, "components": {"correct": 1.0 if ok else 0.0}, "info": {}}
    if op == "step":
        return {"observation": {"text": ""}, "reward": 0.0, "done": True, "info": {"termination": "done"}}
    return {}


def serve(ident, raw):
    req = json.loads(raw)
    op = req.get("op")
    with lock:
        calls[op] = calls.get(op, 0) + 1
        n = calls[op]
    fault = args.fault if (op == args.op and args.every > 0 and n % args.every == 0) else "none"
    rid = req.get("id")
    if fault == "hang":
        return
    if fault == "slow":
        time.sleep(0.3)
    body = {"ok": True, "id": rid, "result": result(req)}
    if fault == "wrong_id":
        body["id"] = (rid or 0) + 1000
    if fault == "error":
        body = {"ok": False, "id": rid, "error": {"code": "internal", "message": "misbehaving env raised"}}
    if fault == "bigreward" and op == "verify":
        body["result"]["reward"] = 1e308
    data = json.dumps(body).encode()
    if fault == "nan":
        data = json.dumps({"ok": True, "id": rid, "result": {"reward": float("nan")}}).encode()
    if fault == "bad_utf8":
        data = data.replace(b'"ok"', b'"\xff\xfe"', 1)
    if fault == "not_json":
        data = b"this is not json"
    frames = [ident, b"", data]
    if fault == "extra_frames":
        frames.append(b"an extra frame")
    out.put(frames)
    with lock:
        answered[op] = answered.get(op, 0) + 1
        if args.count_file:
            tmp = args.count_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(answered, f)
            os.replace(tmp, args.count_file)


while True:
    if sock.poll(5):
        ident, empty, raw = sock.recv_multipart()[:3]
        threading.Thread(target=serve, args=(ident, raw), daemon=True).start()
    while True:
        try:
            sock.send_multipart(out.get_nowait())
        except queue.Empty:
            break
