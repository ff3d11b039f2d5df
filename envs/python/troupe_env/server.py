"""The protocol server: a ZeroMQ REP socket answering hello/reset/step/verify/release/shutdown.

Requests and replies are single-frame JSON objects (see envs/PROTOCOL.md). Exceptions raised by
user code become error replies naming the op and the exception; the server keeps serving.
"""
import json
import os
import sys
import traceback

PROTOCOL = "troupe.env/1"


class EnvError(Exception):
    """Raise from reset/step/verify for a bad input; the reply carries code invalid_input."""


class Env:
    """Base class. Override reset() and verify(), and step() for multi-turn envs."""

    name = "python_env"
    version = "1"
    multi_turn = False
    max_turns = 1
    tools = []  # [{"name": ..., "description": ..., "parameters": {json schema}}]

    def __init__(self, config=None):
        self.config = dict(config or {})
        self.metadata = {}  # the current episode's metadata (set by the server after reset)

    def setup(self):
        """Once per instance, before its first episode (load data, start a sandbox)."""

    def teardown(self):
        """Once per instance, at shutdown."""

    def reset(self, seed, options):
        """Start an episode. Return an observation: {"text", "messages", "metadata"} or a str."""
        raise NotImplementedError

    def step(self, action):
        """One turn. Return {"observation", "reward", "components", "done", "info"}."""
        result = _verify_result(self.verify(self.metadata, action))
        result.update({"done": True, "observation": {"text": ""}})
        return result

    def verify(self, metadata, completion):
        """Score a completion for a prompt's metadata: a float, or {"reward", "components", "info"}."""
        raise NotImplementedError

    def release(self):
        """End of an episode (also after a failure): free what reset() acquired."""

    def info(self):
        return {"name": self.name, "version": str(self.version), "multi_turn": bool(self.multi_turn),
                "max_turns": int(self.max_turns), "tools": list(self.tools)}


def _observation(obs):
    if isinstance(obs, str):
        return {"text": obs, "messages": [{"role": "user", "content": obs}], "metadata": {}}
    if not isinstance(obs, dict):
        raise EnvError(f"reset() must return a dict or a str, got {type(obs).__name__}")
    out = {"text": obs.get("text", ""), "messages": obs.get("messages", []), "metadata": obs.get("metadata", {})}
    if not out["messages"] and out["text"]:
        out["messages"] = [{"role": "user", "content": out["text"]}]
    return out


def _verify_result(v):
    if isinstance(v, bool) or isinstance(v, (int, float)):
        return {"reward": float(v), "components": {}, "info": {}}
    if isinstance(v, dict) and "reward" in v:
        return {"reward": float(v["reward"]), "components": dict(v.get("components", {})), "info": dict(v.get("info", {}))}
    raise EnvError(f"verify() must return a number or a dict with 'reward', got {v!r:.100}")


def _step_result(s):
    if not isinstance(s, dict):
        raise EnvError(f"step() must return a dict, got {type(s).__name__}")
    obs = s.get("observation", {"text": ""})
    return {"observation": _observation(obs) if obs else {"text": "", "messages": [], "metadata": {}},
            "reward": float(s.get("reward", 0.0)), "components": dict(s.get("components", {})),
            "done": bool(s.get("done", False)), "info": dict(s.get("info", {}))}


class _Sessions:
    """Episode id -> Env instance, over a pool of reusable instances."""

    def __init__(self, factory, config):
        self.factory, self.config = factory, config
        self.live, self.pool = {}, []
        self.verifier = None
        self.probe = self._new()  # validates the config at start-up and answers hello
        self.pool.append(self.probe)

    def _new(self):
        env = self.factory(self.config)
        env.setup()
        return env

    def acquire(self):
        return self.pool.pop() if self.pool else self._new()

    def close(self):
        for env in list(self.live.values()) + self.pool + ([self.verifier] if self.verifier else []):
            try:
                env.teardown()
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass


def _error(rid, code, message):
    return {"ok": False, "id": rid, "error": {"code": code, "message": message}}


def handle_request(sessions, req):
    """Answers one request dict (no sockets). Returns (reply, shutdown_requested)."""
    if not isinstance(req, dict):
        return _error(None, "invalid_input", "request must be a JSON object"), False
    rid, op = req.get("id"), req.get("op")

    def ok(result):
        return {"ok": True, "id": rid, "result": result}

    def session():
        s = req.get("session")
        if not isinstance(s, str):
            raise EnvError(f"{op}: request needs a string 'session' (the episode id)")
        return s

    try:
        if op == "hello":
            return ok({"protocol": PROTOCOL, "env": sessions.probe.info()}), False
        if op == "shutdown":
            return ok({}), True
        if op == "reset":
            sid = session()
            env = sessions.live.pop(sid, None)
            if env is not None:
                env.release()
            else:
                env = sessions.acquire()
            seed = req.get("seed", 0)
            if not isinstance(seed, int) or seed < 0:
                raise EnvError("reset: 'seed' must be a non-negative integer")
            options = req.get("options") or {}
            try:
                obs = _observation(env.reset(seed, options))
            except Exception:
                env.release()
                sessions.pool.append(env)
                raise
            env.metadata = obs["metadata"]
            sessions.live[sid] = env
            return ok(obs), False
        if op == "step":
            sid = session()
            env = sessions.live.get(sid)
            if env is None:
                raise EnvError(f"step: unknown episode '{sid}' (reset it first)")
            action = req.get("action")
            if not isinstance(action, str):
                raise EnvError("step: request needs a string 'action'")
            return ok(_step_result(env.step(action))), False
        if op == "verify":
            completion = req.get("completion")
            if not isinstance(completion, str):
                raise EnvError("verify: request needs a string 'completion'")
            if sessions.verifier is None:
                sessions.verifier = sessions._new()
            return ok(_verify_result(sessions.verifier.verify(req.get("metadata") or {}, completion))), False
        if op == "release":
            env = sessions.live.pop(session(), None)
            if env is not None:
                try:
                    env.release()
                    sessions.pool.append(env)
                except Exception:  # noqa: BLE001 - a failing release drops the instance
                    pass
            return ok({}), False
        raise EnvError(f"unknown op '{op}' (expected hello, reset, step, verify, release, shutdown)")
    except EnvError as e:
        return _error(rid, "invalid_input", str(e)), False
    except Exception as e:  # noqa: BLE001 - user code: report, keep serving
        tb = traceback.format_exc(limit=3).strip().splitlines()
        where = tb[-3].strip() if len(tb) >= 3 else ""
        return _error(rid, "internal", f"{op}: {type(e).__name__}: {e} ({where})"), False


def _arg(argv, flag):
    if flag in argv:
        i = argv.index(flag)
        if i + 1 < len(argv):
            return argv[i + 1]
    return None


def serve(factory, bind=None, config=None, argv=None):
    """Serve env instances made by factory(config) until a shutdown request or the parent exits.

    bind: ZeroMQ address; default --bind from the command line, else $TROUPE_ENV_BIND.
    config: dict; default --config JSON from the command line, else $TROUPE_ENV_CONFIG, else {}.
    """
    import zmq

    argv = sys.argv[1:] if argv is None else argv
    bind = bind or _arg(argv, "--bind") or os.environ.get("TROUPE_ENV_BIND")
    if not bind:
        sys.stderr.write("troupe_env: error: no address to bind: pass --bind ADDR or set TROUPE_ENV_BIND\n")
        sys.exit(2)
    if config is None:
        text = _arg(argv, "--config") or os.environ.get("TROUPE_ENV_CONFIG") or "{}"
        try:
            config = json.loads(text)
        except ValueError as e:
            sys.stderr.write(f"troupe_env: error: config is not JSON ({e}): {text[:200]}\n")
            sys.exit(2)
    try:
        sessions = _Sessions(factory, config)
    except Exception as e:  # noqa: BLE001 - bad config: say so and exit 2, like troupe
        sys.stderr.write(f"troupe_env: error: cannot create env: {type(e).__name__}: {e}\n")
        sys.exit(2)
    parent = int(os.environ.get("TROUPE_ENV_PARENT_PID", "0") or 0)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    limit = os.environ.get("TROUPE_ENV_MAX_MESSAGE_BYTES", "")
    if limit.isdigit() and int(limit) > 0:  # envs[].max_message_bytes: a larger request is dropped unread
        sock.setsockopt(zmq.MAXMSGSIZE, int(limit))
    try:
        sock.bind(bind)
    except zmq.ZMQError as e:
        sys.stderr.write(f"troupe_env: error: cannot bind '{bind}': {e}\n")
        sys.exit(2)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    try:
        while True:
            if parent > 0 and os.getppid() != parent:
                break  # troupe is gone: do not linger as an orphan
            if not poller.poll(100):
                continue
            raw = sock.recv()
            try:
                req = json.loads(raw)
            except ValueError:
                reply, stop = _error(None, "invalid_input", "request is not valid JSON"), False
            else:
                reply, stop = handle_request(sessions, req)
            sock.send(json.dumps(reply, default=str).encode())
            if stop:
                break
    finally:
        sessions.close()
        sock.close(0)
