"""e2e.elastic_join's checks: a run that members joined and left against the uninterrupted run.

  check_join.py REF_RUN RUN JOB_LOG STATUS_JSON N
Exactly once, not bit for bit: the same rows (steps, phases, evals) as REF_RUN, every GRPO step
trained once on every prompt of the step, the same episode count in the ledger of the last
checkpoint; each joiner sampled within 2 steps of joining; one died and was noticed; troupe
status (asked over tcp) listed the three generators with their versions.
"""
import json
import os
import re
import sys


def rows(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def shape(run):
    return [(r["phase"], r["step"], "eval_accuracy" in r) for r in rows(run)]


def ledger(run):
    with open(os.path.join(run, "checkpoints", "latest", "state.json")) as f:
        state = json.load(f)
    return state["extra"]["ledger"]["trained_episodes"]


def main(ref, run, log, status, n):
    if shape(ref) != shape(run):
        fail("the rows differ from the uninterrupted run's:\n%s\n%s" % (shape(ref), shape(run)))
    grpo = [r for r in rows(run) if r["phase"] == "grpo" and "eval_accuracy" not in r]
    if [r["step"] for r in grpo] != sorted({r["step"] for r in grpo}) or len(grpo) != n:
        fail("GRPO steps not each once: %s" % [r["step"] for r in grpo])
    for r in grpo:
        if r["groups_generated"] != 8 or r["env_failures"] != 0:
            fail("step %d: %s groups generated, %s env failures" % (r["step"], r["groups_generated"], r["env_failures"]))
    if ledger(ref) != ledger(run):
        fail("trained episodes %s, the uninterrupted run %s" % (ledger(run), ledger(ref)))
    text = open(log).read()
    firsts = re.findall(r"sampled its first rollout at step (\d+) \(joined during step (\d+)\)", text)
    if len(firsts) != 2:
        fail("expected 2 joiners' first rollouts in the log, found %s" % firsts)
    for first, joined in firsts:
        # a joiner is admitted at the weight sync that ends the step it joined in, and samples the next
        if int(first) - int(joined) > 2:
            fail("a joiner's first rollout came at step %s, %d steps after it joined" % (first, int(first) - int(joined)))
    if "is down (silent" not in text:
        fail("the killed member was not noticed")
    st = json.load(open(status))
    gens = [m for m in st["members"] if m["role"] == "generator"]
    if len(gens) != 3 or any(m["version"] < 0 for m in gens):
        fail("troupe status: %s" % gens)
    print("ok: %d steps, %d episodes trained, joiners' first rollouts %s" % (len(grpo), ledger(run), firsts))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
