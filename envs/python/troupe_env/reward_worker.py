"""The reward-hook worker: imports a user's `module:function` once, then scores one request per line.

Run by troupe (envs/builtin/reward_hook.cpp) as `python reward_worker.py --reward SPEC --base-dir DIR`
with a socket as stdin and stdout; it needs nothing beyond the standard library. Invariant: stdout
carries only this protocol (one JSON object per line: first {"ready": ...}, then one reply per
request, in order); whatever user code prints goes to stderr, which troupe keeps in a log.

    request  {"id": N, "prompt": str, "response": str, "reference": any, "row": {...}}
    reply    {"id": N, "ok": true, "reward": float, "components": {name: float}}
             {"id": N, "ok": false, "reason": "reward_error" | "reward_bad_return", "message": str}
"""
import argparse
import importlib
import importlib.util
import json
import math
import os
import signal
import sys
import traceback


def load_function(spec, base_dir):
    """`file.py:function` (relative to base_dir) or `package.module:function` -> the callable."""
    if ":" not in spec:
        raise ValueError(f"reward '{spec}' must be MODULE:FUNCTION (e.g. my_reward.py:score or my_pkg.rewards:score)")
    module_part, function = spec.rsplit(":", 1)
    if not module_part or not function:
        raise ValueError(f"reward '{spec}' must be MODULE:FUNCTION (e.g. my_reward.py:score or my_pkg.rewards:score)")
    if base_dir and base_dir not in sys.path:
        sys.path.insert(0, base_dir)
    if module_part.endswith(".py") or "/" in module_part:
        path = module_part if os.path.isabs(module_part) else os.path.join(base_dir or ".", module_part)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"reward '{spec}': file {path} does not exist")
        name = "troupe_reward_" + os.path.splitext(os.path.basename(path))[0]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        loader_spec.loader.exec_module(module)
        where = f"file {path}"
    else:
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(f"reward '{spec}': cannot import module '{module_part}' ({e}; "
                                      f"searched {base_dir or '.'} and sys.path)") from None
        where = f"module {module_part} ({getattr(module, '__file__', None) or 'built in'})"
    target = module
    for part in function.split("."):
        if not hasattr(target, part):
            raise AttributeError(f"reward '{spec}': {where} has no function '{function}'")
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"reward '{spec}': '{function}' in {where} is not callable")
    return target


def _number(value, what):
    """A finite float from a number (bools count as 0/1), else a ValueError naming `what`."""
    if isinstance(value, bool) or isinstance(value, (int, float)):
        x = float(value)
        if not math.isfinite(x):
            raise ValueError(f"{what} is {x}, not a finite number")
        return x
    raise ValueError(f"{what} is {type(value).__name__} {value!r:.80}, not a number")


def interpret(result):
    """The function's return value -> (reward, components); ValueError for a bad return."""
    if isinstance(result, dict):
        if not result:
            raise ValueError("returned an empty dict (give a number, or a dict of named numbers)")
        components = {}
        for key, value in result.items():
            if key == "reward":
                continue
            components[str(key)] = _number(value, f"returned dict key '{key}'")
        if "reward" in result:
            return _number(result["reward"], "returned dict key 'reward'"), components
        return math.fsum(components.values()), components
    try:
        return _number(result, "the return value"), {}
    except ValueError:
        raise ValueError(f"returned {type(result).__name__} {result!r:.80}, not a float or a dict") from None


def answer(fn, request):
    out = {"id": request.get("id")}
    try:
        result = fn(request.get("prompt", ""), request.get("response", ""), request.get("reference"),
                    request.get("row", {}))
    except Exception as e:  # the user's code raised: this call fails, the worker goes on
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        out.update(ok=False, reason="reward_error", message=f"raised {type(e).__name__}: {e}")
        return out
    try:
        reward, components = interpret(result)
    except ValueError as e:
        out.update(ok=False, reason="reward_bad_return", message=str(e))
        return out
    out.update(ok=True, reward=reward, components=components)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reward", required=True, help="MODULE:FUNCTION or FILE.py:FUNCTION")
    parser.add_argument("--base-dir", default="", help="the experiment YAML's folder (files and modules start here)")
    args = parser.parse_args()
    # troupe stops a worker by closing its stdin (or SIGKILL); a Ctrl-C or SIGTERM meant for the run
    # must not kill it mid-step while troupe finishes that step
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # the protocol keeps the real stdout; anything else written to fd 1 (print, C extensions) goes to stderr
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", newline="\n")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj):
        proto.write(json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n")
        proto.flush()

    try:
        fn = load_function(args.reward, args.base_dir)
    except Exception as e:  # a missing module, file or function, or an import that raised
        traceback.print_exc(file=sys.stderr)
        send({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return 2
    send({"ready": True})
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        send(answer(fn, json.loads(line)))
    return 0  # stdin closed: troupe is gone or done


if __name__ == "__main__":
    sys.exit(main())
