"""Writes gsm8k_style_train.jsonl and gsm8k_style_eval.jsonl: short grade-school word problems in
GSM8K's own row format ({"question": ..., "answer": "<worked solution>\\n#### <number>"}), made from
templates with small numbers so that a 135M-parameter model solves some of them. Deterministic
(seeded); rerun to regenerate: python3 configs/data/make_gsm8k_style.py
"""
import json
import os
import random

NAMES = ["Tom", "Ana", "Lee", "Maya", "Sam", "Ivy", "Omar", "Zoe", "Ben", "Lia"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "stamps", "shells"]


def add(r):
    n, it = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(2, 30), r.randint(2, 30)
    q = f"{n} has {a} {it}. {n} gets {b} more {it}. How many {it} does {n} have now?"
    return q, f"{n} has {a} + {b} = <<{a}+{b}={a+b}>>{a+b} {it}.\n#### {a+b}"


def sub(r):
    n, it = r.choice(NAMES), r.choice(ITEMS)
    a = r.randint(10, 60)
    b = r.randint(1, a - 1)
    q = f"{n} had {a} {it} and gave {b} of them to a friend. How many {it} are left?"
    return q, f"{n} has {a} - {b} = <<{a}-{b}={a-b}>>{a-b} {it} left.\n#### {a-b}"


def mul(r):
    n, it = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(2, 9), r.randint(2, 12)
    q = f"{n} buys {a} bags with {b} {it} in each bag. How many {it} does {n} buy?"
    return q, f"{n} buys {a} * {b} = <<{a}*{b}={a*b}>>{a*b} {it}.\n#### {a*b}"


def price(r):
    n, it = r.choice(NAMES), r.choice(ITEMS)
    a, p = r.randint(2, 12), r.randint(2, 9)
    t = a * p
    q = f"Each of the {it} costs ${p}. {n} buys {a} of them. How many dollars does {n} spend?"
    return q, f"{n} spends {a} * {p} = <<{a}*{p}={t}>>{t} dollars.\n#### {t}"


def two_step(r):
    n, it = r.choice(NAMES), r.choice(ITEMS)
    a, b, c = r.randint(5, 40), r.randint(2, 20), r.randint(1, 5)
    s = a + b
    c = min(c, s - 1)
    q = f"{n} has {a} {it}, finds {b} more, then loses {c}. How many {it} does {n} have?"
    return q, (f"After finding some, {n} has {a} + {b} = <<{a}+{b}={s}>>{s} {it}.\n"
               f"After losing some, {n} has {s} - {c} = <<{s}-{c}={s-c}>>{s-c} {it}.\n#### {s-c}")


def share(r):
    n, it = r.choice(NAMES), r.choice(ITEMS)
    k, each = r.randint(2, 6), r.randint(2, 10)
    total = k * each
    q = f"{n} shares {total} {it} equally among {k} friends. How many {it} does each friend get?"
    return q, f"Each friend gets {total} / {k} = <<{total}/{k}={each}>>{each} {it}.\n#### {each}"


def big(r):
    n = r.choice(NAMES)
    a, b = r.randint(1000, 4000), r.randint(1000, 4000)
    q = f"A shop sold {a:,} tickets on Monday and {b:,} on Tuesday. How many tickets did it sell in all?"
    return q, f"It sold {a} + {b} = <<{a}+{b}={a+b}>>{a+b} tickets.\n#### {a+b:,}"


MAKERS = [add, sub, mul, price, two_step, share, big]


def rows(seed, n, seen):
    r = random.Random(seed)
    out = []
    while len(out) < n:
        q, a = r.choice(MAKERS)(r)
        if q in seen:
            continue
        seen.add(q)
        out.append({"question": q, "answer": a})
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    seen = set()
    for name, seed, n in [("gsm8k_style_eval.jsonl", 2, 60), ("gsm8k_style_train.jsonl", 1, 400)]:
        with open(os.path.join(here, name), "w") as f:
            for row in rows(seed, n, seen):
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
