"""A server that speaks the verifiers env-server framing but answers `run` wrongly, for troupe's
failure tests: `garbage` replies with bytes that are not msgpack, `schema` with a msgpack response
of the wrong shape. `health` is answered properly, so the client starts.
    bad_vf_server.py garbage|schema"""
import sys

import msgpack
import zmq

mode = sys.argv[1]
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.bind("tcp://127.0.0.1:0")
print(f"bad verifiers server on {sock.getsockopt_string(zmq.LAST_ENDPOINT)}", flush=True)
while True:
    frames = sock.recv_multipart()
    if len(frames) != 4:
        continue
    client, request_id, method, _ = frames
    if method == b"health":
        data = msgpack.packb({"success": True, "error": None})
    elif method == b"run" and mode == "garbage":
        data = b"\xc1\xc1 this is not msgpack"
    elif method == b"run":
        data = msgpack.packb({"success": True, "head": "not a mapping", "traces": 7})
    else:
        data = msgpack.packb({"success": True, "error": None, "cancelled": False})
    sock.send_multipart([client, request_id, b"reply", data])
