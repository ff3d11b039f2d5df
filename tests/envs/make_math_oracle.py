#!/usr/bin/env python3
"""The oracle verdicts of tests/envs/math_corpus.jsonl: for each (answer, reference) pair,
math_verify.verify(parse(reference), parse(answer)) of the real `math-verify` package from PyPI,
each side given to parse() as inline LaTeX ("$...$", the form a clean answer takes).

    make_math_oracle.py          rewrite the corpus' "oracle" fields (run after adding pairs)
    make_math_oracle.py --check  exit 1 when a committed verdict differs from math-verify's (a test)

math-verify is installed on first use into $TROUPE_CACHE (default ~/.cache/troupe)/venv-math-verify
unless this Python has it; the script then runs itself again with that venv's Python."""
import fcntl
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "math_corpus.jsonl")
CACHE = os.environ.get("TROUPE_CACHE", os.path.expanduser("~/.cache/troupe"))
VENV = os.path.join(CACHE, "venv-math-verify")
VENV_PY = os.path.join(VENV, "bin", "python")
VERSION = "0.9.0"  # the math-verify the committed verdicts come from


def has_math_verify(py):
    probe = f"import importlib.metadata as m; assert m.version('math-verify') == '{VERSION}'"
    return os.path.exists(py) and subprocess.run([py, "-c", probe], capture_output=True).returncode == 0


def ensure_venv():
    os.makedirs(CACHE, exist_ok=True)
    with open(VENV + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not has_math_verify(VENV_PY):
            print(f"installing math-verify=={VERSION} into {VENV}", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "venv", "--clear", VENV], check=True)
            r = subprocess.run([VENV_PY, "-m", "pip", "install", "-q", f"math-verify=={VERSION}"])
            if r.returncode != 0 or not has_math_verify(VENV_PY):
                sys.exit("make_math_oracle: pip install math-verify failed")
    return VENV_PY


def verdict(answer, reference):
    from math_verify import parse, verify
    wrap = lambda s: f"${s}$" if s.strip() else s
    return bool(verify(parse(wrap(reference)), parse(wrap(answer))))


def main():
    if not has_math_verify(sys.executable):
        os.execv(ensure_venv(), [VENV_PY, os.path.abspath(__file__)] + sys.argv[1:])
    check = "--check" in sys.argv[1:]
    with open(CORPUS) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    changed = []
    for i, row in enumerate(rows, 1):
        v = verdict(row["answer"], row["reference"])
        if row.get("oracle") != v:
            changed.append(f"math_corpus.jsonl:{i}: {row['answer']!r} vs {row['reference']!r}: "
                           f"committed {row.get('oracle')}, math-verify {v}")
        row["oracle"] = v
    if check:
        for line in changed:
            print(line)
        print(f"{len(rows)} pairs, {len(changed)} committed verdicts differ from math-verify {VERSION}")
        sys.exit(1 if changed else 0)
    with open(CORPUS, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} pairs written, {sum(r['oracle'] for r in rows)} equal, {len(changed)} verdicts changed")


if __name__ == "__main__":
    main()
