#!/usr/bin/env python3
"""troupe's W&B sink (logger.wandb), started by `troupe run` (launch/wandb_sink.cpp): wandb.init,
then one wandb.log(data, step=step) per JSON line {"step": N, "data": {name: number}} read from the
socket at --fd, and wandb.finish() when troupe closes it. Answers "ready" once wandb.init worked;
exits non-zero, its reason on stderr, when wandb is missing or init fails."""
import argparse
import json
import socket
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--project", required=True)
    ap.add_argument("--name", default="")
    ap.add_argument("--mode", choices=("online", "offline", "disabled"), default="online")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--config", default="")
    a = ap.parse_args()
    try:
        import wandb
    except ImportError as e:
        print(f"troupe: logger.wandb: {sys.executable} cannot import wandb ({e}); install it with "
              f"`{sys.executable} -m pip install wandb`, or point TROUPE_PYTHON at a Python that has it",
              file=sys.stderr)
        sys.exit(3)
    config = None
    if a.config:
        try:
            import yaml
            with open(a.config) as f:
                config = yaml.safe_load(f)
        except Exception as e:  # the config is a nicety: the metrics still go
            print(f"troupe: logger.wandb: run config not attached ({a.config}: {e})", file=sys.stderr)
    try:
        run = wandb.init(project=a.project, name=a.name or None, mode=a.mode, dir=a.dir, config=config)
    except Exception as e:
        print(f"troupe: logger.wandb: wandb.init(project={a.project!r}, mode={a.mode!r}) failed: {e}",
              file=sys.stderr)
        sys.exit(4)
    sock = socket.socket(fileno=a.fd)
    sock.sendall(b"ready\n")
    stream = sock.makefile("r", encoding="utf-8")
    for n, line in enumerate(stream, 1):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
            run.log(row["data"], step=int(row["step"]))
        except (ValueError, KeyError, TypeError) as e:
            print(f"troupe: logger.wandb: row {n} skipped ({e}): {line[:200]}", file=sys.stderr)
    run.finish()
    print("troupe: logger.wandb: finished", file=sys.stderr)


if __name__ == "__main__":
    main()
