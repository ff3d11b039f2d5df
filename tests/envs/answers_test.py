#!/usr/bin/env python3
"""envs.answer_extract.python / envs.math_verify.python: the Python SDK's troupe_env.answers on the
cases the C++ tests read (tests/envs/extract_cases.jsonl; tests/envs/math_corpus.jsonl with
math-verify's verdicts and the listed disagreements), so both languages give the same answers.
    answers_test.py extract|math"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "envs", "python"))
from troupe_env import answers  # noqa: E402


def read(name):
    with open(os.path.join(HERE, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_extract():
    failures = []
    for i, c in enumerate(read("extract_cases.jsonl"), 1):
        got = answers.extract(c["text"], c["how"], c.get("pattern"))
        if got != c["expected"]:
            failures.append(f"extract_cases.jsonl:{i}: extract({c['text']!r}, {c['how']!r}) = {got!r}, want {c['expected']!r}")
    for how, pattern, want in [("regex", None, "needs 'pattern'"), ("regex", "(", "not a valid regex"),
                               ("regex", r"\d+", "no capture group"), ("boxed", "(x)", "only read with extract: regex"),
                               ("last_line", None, "'how' must be one of")]:
        try:
            answers.extract("x", how, pattern)
            failures.append(f"extract(how={how!r}, pattern={pattern!r}) did not raise")
        except ValueError as e:
            if want not in str(e):
                failures.append(f"extract(how={how!r}, pattern={pattern!r}) raised {e!r}, want {want!r}")
    return failures


def check_math():
    failures = []
    listed = {(d["answer"], d["reference"]) for d in read("math_verify_disagreements.jsonl")}
    corpus = read("math_corpus.jsonl")
    if len(corpus) < 300:
        failures.append(f"the corpus has {len(corpus)} pairs, fewer than 300")
    disagree = 0
    for i, row in enumerate(corpus, 1):
        ours = answers.math_equal(row["answer"], row["reference"])
        differs = ours != row["oracle"]
        disagree += differs
        if differs != ((row["answer"], row["reference"]) in listed):
            failures.append(f"math_corpus.jsonl:{i}: {row['answer']!r} vs {row['reference']!r}: ours {ours}, "
                            f"math-verify {row['oracle']}" + (" (new disagreement)" if differs else " (listed, agrees now)"))
    if disagree != len(listed) or 1 - disagree / len(corpus) < 0.98:
        failures.append(f"{disagree} disagreements of {len(corpus)}, {len(listed)} listed")
    for a, r, want in [("\\frac{1}{2}", "0.5", True), ("50%", "0.5", True), ("1,234", "1234", True),
                       ("\\{1,2\\}", "\\{2,1\\}", True), ("(1,2)", "(2,1)", False), ("x^2+1", "1+x^2", True),
                       ("0.333", "\\frac{1}{3}", False), ("18 dollars", "18", True), ("", "0", False)]:
        if answers.math_equal(a, r) != want:
            failures.append(f"math_equal({a!r}, {r!r}) != {want}")
    return failures


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    checks = {"extract": check_extract, "math": check_math}
    if which not in checks:
        sys.exit("usage: answers_test.py extract|math")
    failures = checks[which]()
    for f in failures:
        print("FAIL:", f)
    print(f"{which}: {'FAILED' if failures else 'ok'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
