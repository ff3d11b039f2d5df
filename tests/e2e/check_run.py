"""Checks on a troupe run directory, used by the tests/e2e ctest entries.

  check_run.py learned RUN_DIR          reward and held-out accuracy rose (GRPO vs SFT/first steps)
  check_run.py files RUN_DIR            the run directory has every artifact docs/architecture.md lists
  check_run.py same RUN_A RUN_B         the training rows agree on every non-timing metric
  check_run.py same_evals RUN_A RUN_B   so do the eval rows (and there are some)
  check_run.py same_keys RUN_A RUN_B    the training rows have the same keys, timings included
  check_run.py staleness RUN_DIR N      every GRPO row has staleness <= N
  check_run.py steps RUN_DIR N          the training rows are steps 1..N, each once (also across --resume)
  check_run.py moved RUN_DIR            most GRPO rows made a real update (reward spread, grad_norm > 0)
  check_run.py dynamic RUN_DIR P R     dynamic sampling: P groups kept unless R rounds ran; both cases seen
  check_run.py episodes RUN_DIR T      multi-turn eval rows: full episodes (1 < eval_turns_mean <= T)
  check_run.py eval_json FILE           the last line of FILE is one JSON object with eval_accuracy
  check_run.py close RUN_A RUN_B STEP TOL  rows identical before STEP, then within TOL (relative) with the same step/groups
  check_run.py mismatch RUN_DIR N [routes|exact]  N GRPO rows, each with finite, sane sampler/learner mismatch
                                        metrics; routes: routing_agreement exactly 1 on every row (routing
                                        replay); exact: that and logprob_diff_max exactly 0 (batch invariance)
"""
import json
import os
import sys

# and the keys ending in _s; the scorers' batch sizes (scorer/batch_requests, scorer/judge/batch_requests_max,
# ...): how requests met in a scorer's batches, which depends on timing
TIMING = ("wall_s", "tokens_per_s", "learner_tokens_per_s")
TIMING_SUFFIXES = ("_s", "batch_requests", "batch_requests_max")
# how the learners hold their state (learner.shard), not what they train: not compared
LAYOUT = ("learner/state_bytes",)


def rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def mismatch(run_dir, n, mode=""):
    import math
    grpo = [r for r in rows(run_dir) if r["phase"] == "grpo" and "eval_accuracy" not in r]
    if len(grpo) != int(n):
        fail("%d GRPO rows, expected %s" % (len(grpo), n))
    keys = ("logprob_diff_max", "logprob_diff_mean", "mismatch_kl", "mismatch_frac", "mismatch_tokens",
            "routing_agreement")
    for r in grpo:
        for k in keys:
            if k not in r or not isinstance(r[k], (int, float)) or not math.isfinite(r[k]):
                fail("step %d: %s missing or not finite: %r" % (r["step"], k, r.get(k)))
        if not 0 <= r["logprob_diff_mean"] <= r["logprob_diff_max"] < 1:
            fail("step %d: logprob_diff_mean %g, max %g" % (r["step"], r["logprob_diff_mean"], r["logprob_diff_max"]))
        if not 0 <= r["mismatch_kl"] < 1e-2 or not 0 <= r["mismatch_frac"] <= 1:
            fail("step %d: mismatch_kl %g, mismatch_frac %g" % (r["step"], r["mismatch_kl"], r["mismatch_frac"]))
        if not 0 <= r["routing_agreement"] <= 1:
            fail("step %d: routing_agreement %g" % (r["step"], r["routing_agreement"]))
        # every response token is compared, stale ones too (the configs sample G = 8 per group)
        total = r["response_len_mean"] * r["groups_generated"] * 8
        if r["env_failures"] == 0 and r["stale_dropped"] == 0 and abs(r["mismatch_tokens"] - total) > 1e-6 * total:
            fail("step %d: mismatch_tokens %g of %g response tokens" % (r["step"], r["mismatch_tokens"], total))
        if mode in ("routes", "exact") and r["routing_agreement"] != 1:
            fail("step %d: routing_agreement %r, expected exactly 1" % (r["step"], r["routing_agreement"]))
        if mode == "exact" and (r["logprob_diff_max"] != 0 or r["mismatch_kl"] != 0):
            fail("step %d: logprob_diff_max %r, mismatch_kl %r, expected exactly 0" % (
                r["step"], r["logprob_diff_max"], r["mismatch_kl"]))
    print("mismatch: %d rows, logprob_diff_max <= %.3g, mean <= %.3g, kl <= %.3g, routing_agreement >= %.4f" % (
        len(grpo), max(r["logprob_diff_max"] for r in grpo), max(r["logprob_diff_mean"] for r in grpo),
        max(r["mismatch_kl"] for r in grpo), min(r["routing_agreement"] for r in grpo)))


def learned(run_dir):
    rs = rows(run_dir)
    evals = [r for r in rs if "eval_accuracy" in r]
    sft = [r for r in evals if r["phase"] == "sft"]
    grpo = [r for r in evals if r["phase"] == "grpo"]
    if not grpo:
        fail("no GRPO eval row")
    base = sft[-1]["eval_accuracy"] if sft else None
    train = [r for r in rs if r["phase"] == "grpo" and "eval_accuracy" not in r]
    n = max(1, len(train) // 4)
    first = sum(r["reward_mean"] for r in train[:n]) / n
    last = sum(r["reward_mean"] for r in train[-n:]) / n
    print("eval after SFT %s, after GRPO %.3f; reward first quarter %.3f, last quarter %.3f"
          % (base, grpo[-1]["eval_accuracy"], first, last))
    if base is not None and not grpo[-1]["eval_accuracy"] > base:
        fail("held-out accuracy did not rise")
    if not last > first:
        fail("training reward did not rise")


REQUIRED = ["step", "phase", "wall_s", "policy_version", "reward_mean", "reward_std", "response_len_mean",
            "truncated_frac", "kl", "clip_frac_low", "clip_frac_high", "entropy", "grad_norm", "lr",
            "tokens_per_s", "env_failures"]


def improved(base_dir, run_dir):
    """run_dir's last held-out accuracy is above base_dir's (the run started from base_dir's model)."""
    def last_eval(d):
        ev = [r["eval_accuracy"] for r in rows(d) if "eval_accuracy" in r]
        if not ev:
            fail("no eval row in " + d)
        return ev[-1]
    a, b = last_eval(base_dir), last_eval(run_dir)
    print("held-out accuracy %.3f (base) -> %.3f" % (a, b))
    if not b > a + 0.05:
        fail("held-out accuracy did not rise by more than 0.05 over the base")


def best(run_dir, metric="eval_accuracy"):
    """checkpoints/best holds the first step with the highest eval metric, even off the checkpoint period."""
    ev = [r for r in rows(run_dir) if metric in r]
    if not ev:
        fail("no eval rows")
    top = max(r[metric] for r in ev)
    want = "step_%d" % next(r["step"] for r in ev if r[metric] == top)
    got = os.path.basename(os.readlink(os.path.join(run_dir, "checkpoints", "best")))
    if got != want:
        fail("checkpoints/best is %s, the best %s (%s) is at %s" % (got, metric, top, want))
    print("best %s %s at %s" % (metric, top, got))


def files(run_dir):
    for p in ("config.resolved.yaml", "metrics.jsonl", "tb", "checkpoints/latest/config.json",
              "checkpoints/latest/model.safetensors", "checkpoints/latest/optimizer.safetensors",
              "checkpoints/latest/state.json"):
        if not os.path.exists(os.path.join(run_dir, p)):
            fail("missing " + p)
    if not [f for f in os.listdir(os.path.join(run_dir, "tb")) if f.startswith("events.out.tfevents")]:
        fail("no TensorBoard event file")
    for r in rows(run_dir):
        if "eval_accuracy" in r:
            for k in ("eval_reward_mean", "phase", "step"):
                if k not in r:
                    fail("eval row lacks " + k)
            continue
        for k in REQUIRED:
            if k not in r:
                fail("step %s lacks %s" % (r.get("step"), k))
        if r["phase"] == "grpo" and not any(k.startswith("reward_mean/") for k in r):
            fail("grpo row lacks per-env reward_mean/<env>")
    print("run directory complete")


def identical_rows(ra, rb, what):
    """Every non-timing value of rows ra equals rb's, row for row."""
    if len(ra) != len(rb) or (what == "eval" and not ra):
        fail("%d vs %d %s rows" % (len(ra), len(rb), what))
    for x, y in zip(ra, rb):
        for k in x:
            if k in TIMING or k in LAYOUT or k.endswith(TIMING_SUFFIXES):
                continue
            if x[k] != y.get(k):
                fail("%s row of step %s: %s = %r vs %r" % (what, x["step"], k, x[k], y.get(k)))
    print("%d %s rows identical" % (len(ra), what))


def same(a, b):
    identical_rows([r for r in rows(a) if "eval_accuracy" not in r],
                   [r for r in rows(b) if "eval_accuracy" not in r], "training")


def same_keys(a, b):
    ra = [r for r in rows(a) if "eval_accuracy" not in r]
    rb = [r for r in rows(b) if "eval_accuracy" not in r]
    if len(ra) != len(rb):
        fail("%d vs %d training rows" % (len(ra), len(rb)))
    for x, y in zip(ra, rb):
        if set(x) != set(y):
            fail("step %s: keys only in %s: %s; only in %s: %s" % (
                x["step"], a, sorted(set(x) - set(y)), b, sorted(set(y) - set(x))))
    print("%d training rows with the same keys" % len(ra))


def same_evals(a, b):
    same(a, b)
    identical_rows([r for r in rows(a) if "eval_accuracy" in r], [r for r in rows(b) if "eval_accuracy" in r], "eval")


def close(a, b, first_diff, tol):
    """The same rows up to step first_diff - 1 bit for bit; from there every non-timing number within
    tol (relative, plus tol absolute) and the same data cursor (step, phase, groups, tokens sampled)."""
    ra = [r for r in rows(a) if "eval_accuracy" not in r]
    rb = [r for r in rows(b) if "eval_accuracy" not in r]
    if len(ra) != len(rb):
        fail("%d vs %d training rows" % (len(ra), len(rb)))
    worst = 0.0
    for x, y in zip(ra, rb):
        exact = x["step"] < first_diff
        for k in x:
            if k in TIMING or k in LAYOUT or k.endswith(TIMING_SUFFIXES):
                continue
            u, v = x[k], y.get(k)
            if exact or not isinstance(u, (int, float)) or k in ("step", "groups_generated", "groups_kept"):
                if u != v:
                    fail("step %s: %s = %r vs %r" % (x["step"], k, u, v))
                continue
            if not isinstance(v, (int, float)):
                fail("step %s: %s = %r vs %r" % (x["step"], k, u, v))
            d = abs(u - v)
            worst = max(worst, d / (1 + abs(u)))
            if d > tol * (1 + abs(u)):
                fail("step %s: %s = %r vs %r (tolerance %g)" % (x["step"], k, u, v, tol))
    print("%d training rows: identical before step %d, within %.3g after" % (len(ra), first_diff, worst))


def staleness(run_dir, n):
    g = [r for r in rows(run_dir) if r["phase"] == "grpo" and "eval_accuracy" not in r]
    if not g:
        fail("no GRPO rows")
    worst = max(r["staleness"] for r in g)
    print("max staleness", worst, "idle_s mean", sum(r["idle_s"] for r in g) / len(g))
    if worst > n:
        fail("staleness %d > %d" % (worst, n))


def steps(run_dir, n):
    got = [r["step"] for r in rows(run_dir) if "eval_accuracy" not in r]
    if got != list(range(1, n + 1)):
        fail("training rows are steps %s, expected 1..%d once each" % (got, n))
    print("steps 1..%d once each" % n)


def moved(run_dir):
    g = [r for r in rows(run_dir) if r["phase"] == "grpo" and "eval_accuracy" not in r]
    real = [r for r in g if r["reward_std"] > 0 and r["grad_norm"] > 0]
    print("%d of %d GRPO rows made an update" % (len(real), len(g)))
    if len(real) * 2 < len(g):
        fail("only %d of %d GRPO rows made an update: a comparison of them means little" % (len(real), len(g)))


def dynamic(run_dir, p, max_rounds):
    g = [r for r in rows(run_dir) if r["phase"] == "grpo" and "eval_accuracy" not in r]
    if not g:
        fail("no GRPO rows")
    refilled = bounded = 0
    for r in g:
        kept, rounds, gen = r["groups_kept"], r["generation_rounds"], r["groups_generated"]
        print("step %d: %d rounds, %d of %d groups kept" % (r["step"], rounds, kept, gen))
        if gen != rounds * p or not 1 <= rounds <= max_rounds or kept > p:
            fail("step %d: inconsistent counts" % r["step"])
        if kept < p and rounds != max_rounds:
            fail("step %d: stopped at %d rounds with only %d groups kept" % (r["step"], rounds, kept))
        if kept == p and rounds > 1:
            refilled += 1
        if kept < p:
            bounded += 1
    if not refilled or not bounded:
        fail("want a refilled step and a bounded step (refilled %d, bounded %d)" % (refilled, bounded))


def episodes(run_dir, max_turns):
    evals = [r for r in rows(run_dir) if "eval_accuracy" in r]
    if not evals:
        fail("no eval row")
    for r in evals:
        t = r.get("eval_turns_mean")
        print("eval step %d: accuracy %.3f, reward %.3f, turns %s" % (r["step"], r["eval_accuracy"], r["eval_reward_mean"], t))
        if t is None or not 1 <= t <= max_turns or not 0 <= r["eval_accuracy"] <= 1:
            fail("eval row at step %d: bad eval_turns_mean/eval_accuracy" % r["step"])
    if not any(r["eval_turns_mean"] > 1 for r in evals):
        fail("eval ran only first turns")


def eval_json(path):
    with open(path) as f:
        last = [line for line in f if line.strip()][-1]
    j = json.loads(last)
    if not 0 <= j["eval_accuracy"] <= 1:
        fail("bad eval_accuracy")
    print("eval json ok:", last.strip())


def distilled(run_dir):
    """distill: the reverse KL to the teacher fell and the teacher's log-prob of the samples rose."""
    rs = [r for r in rows(run_dir) if r.get("phase") == "grpo" and "distill/reverse_kl" in r]
    if len(rs) < 6:
        fail("%d GRPO rows with distill/reverse_kl" % len(rs))
    kl = [r["distill/reverse_kl"] for r in rs]
    tl = [r["distill/teacher_logprob_mean"] for r in rs]
    first, last = sum(kl[:3]) / 3, sum(kl[-3:]) / 3
    if not last < 0.8 * first:
        fail("distill/reverse_kl did not fall: first steps %.4f, last steps %.4f (%s)" % (first, last, kl))
    if not sum(tl[-3:]) > sum(tl[:3]):
        fail("distill/teacher_logprob_mean did not rise: %s" % tl)
    for r in rs:
        if r.get("scorer/failures", -1) != 0 or r.get("scorer/requests", 0) < 1:
            fail("step %s: scorer/requests %r, scorer/failures %r" % (r["step"], r.get("scorer/requests"),
                                                                      r.get("scorer/failures")))
    print("reverse KL %.4f -> %.4f, teacher log-prob %.4f -> %.4f" % (first, last, sum(tl[:3]) / 3, sum(tl[-3:]) / 3))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "learned":
        learned(sys.argv[2])
    elif cmd == "files":
        files(sys.argv[2])
    elif cmd == "distilled":
        distilled(sys.argv[2])
    elif cmd == "same":
        same(sys.argv[2], sys.argv[3])
    elif cmd == "improved":
        improved(sys.argv[2], sys.argv[3])
    elif cmd == "same_keys":
        same_keys(sys.argv[2], sys.argv[3])
    elif cmd == "same_evals":
        same_evals(sys.argv[2], sys.argv[3])
    elif cmd == "staleness":
        staleness(sys.argv[2], int(sys.argv[3]))
    elif cmd == "steps":
        steps(sys.argv[2], int(sys.argv[3]))
    elif cmd == "best":
        best(sys.argv[2])
    elif cmd == "moved":
        moved(sys.argv[2])
    elif cmd == "dynamic":
        dynamic(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "episodes":
        episodes(sys.argv[2], int(sys.argv[3]))
    elif cmd == "eval_json":
        eval_json(sys.argv[2])
    elif cmd == "close":
        close(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    elif cmd == "mismatch":
        mismatch(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "")
    else:
        fail("unknown check " + cmd)
