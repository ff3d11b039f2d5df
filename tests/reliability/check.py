"""Checks on a reliability test's run directory.

  check.py count RUN_DIR KEY         prints the sum of KEY over the GRPO rows
  check.py atleast RUN_DIR KEY N     the sum of KEY over the GRPO rows is >= N
  check.py none RUN_DIR KEY          no GRPO row has KEY (or it is 0)
  check.py steps RUN_DIR N           GRPO rows are steps 1..N, each with a full batch (groups_generated)
  check.py termination RUN_DIR T     some trajectory ended with termination T (and says why in error)
  check.py trajectories RUN_DIR      every field TRAJECTORY.md lists is filled
  check.py turns RUN_DIR             multi-turn: one turn entry per model turn, each with info
  check.py episodes_once RUN_A RUN_B  every trained episode (step, prompt index, sample) is in each
                                     trajectory log exactly once, and both logs hold the same episodes
                                     with the same tokens and policy versions (trajectories_per_step
                                     covers the whole batch)
  check.py ledger STEP_DIR K N       the checkpoint's ledger: GRPO steps 1..K trained, N rollouts
                                     finished but not trained (steps K+1..K+N), pipeline.bin listed
"""
import glob
import json
import os
import sys


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in (json.loads(l) for l in f if l.strip()) if r.get("phase") == "grpo" and "reward_mean" in r
                and "eval_accuracy" not in r]


def trajs(run_dir):
    out = []
    for p in glob.glob(os.path.join(run_dir, "trajectories", "*.jsonl")):
        with open(p) as f:
            out += [json.loads(l) for l in f if l.strip()]
    if not out:
        fail("no trajectories")
    return out


cmd, run = sys.argv[1], sys.argv[2]
if cmd in ("count", "atleast", "none"):
    key = sys.argv[3]
    n = sum(r.get(key) or 0 for r in rows(run))
    print(key, n)
    if cmd == "atleast" and n < float(sys.argv[4]):
        fail(f"{key} = {n} < {sys.argv[4]}")
    if cmd == "none" and n != 0:
        fail(f"{key} = {n}, expected none")
elif cmd == "steps":
    rs = rows(run)
    want = int(sys.argv[3])
    if [r["step"] for r in rs] != list(range(1, want + 1)):
        fail(f"steps {[r['step'] for r in rs]}, expected 1..{want}")
    for r in rs:
        if r["groups_generated"] < 8:
            fail(f"step {r['step']}: only {r['groups_generated']} groups")
elif cmd == "termination":
    want = sys.argv[3]
    hit = [t for t in trajs(run) if t["termination"] == want]
    if not hit:
        fail(f"no trajectory ended with {want}: {sorted(set(t['termination'] for t in trajs(run)))}")
    if not all(t["error"] for t in hit):
        fail(f"a {want} trajectory has no error message")
    print(want, len(hit), "e.g.", hit[0]["error"][:200])
elif cmd == "trajectories":
    for t in trajs(run):
        if not t["env"]["version"]:
            fail("env.version is empty")
        if not t["prompt"]["messages"]:
            fail("prompt.messages is empty")
        if t["termination"] == "done" and not t["reward_components"]:
            fail("reward_components is empty")
        if not t["timings"]["total_s"] > 0 or not t["timings"]["start_unix_s"] > 0:
            fail(f"timings are zero: {t['timings']}")
        if t["turns"] and t["turns"][0]["observation"] == t["prompt"]["text"] and t["prompt"]["text"]:
            fail("the prompt is stored twice (prompt.text and turns[0].observation)")
    print("trajectories ok:", len(trajs(run)))
elif cmd == "turns":
    multi = [t for t in trajs(run) if len(t["turns"]) > 1]
    if not multi:
        fail("no trajectory has more than one turn entry")
    for t in multi:
        for u, turn in enumerate(t["turns"]):
            if not isinstance(turn["info"], dict) or (u > 0 and not turn["observation"]):
                fail(f"turn {u} of {t['episode_id']} lacks info or observation: {turn}")
    print("multi-turn trajectories:", len(multi), "max turns", max(len(t["turns"]) for t in multi))
elif cmd == "episodes_once":
    def episodes(run_dir):
        seen = {}
        for t in trajs(run_dir):
            key = (t["step"], t["extra"]["prompt_index"], t["extra"]["sample"])
            if key in seen:
                fail(f"{run_dir}: episode {key} is in the trajectory log twice")
            seen[key] = ([u["completion_tokens"] for u in t["turns"]], [u["policy_version"] for u in t["turns"]],
                         t["extra"].get("token_versions"))
        return seen
    a, b = episodes(run), episodes(sys.argv[3])
    if a.keys() != b.keys():
        fail(f"episodes differ: only in {run}: {sorted(a.keys() - b.keys())[:5]}, only in {sys.argv[3]}: "
             f"{sorted(b.keys() - a.keys())[:5]}")
    for key in a:
        if a[key] != b[key]:
            fail(f"episode {key}: tokens or policy version differ: {a[key]} vs {b[key]}")
    print("episodes exactly once, identical in both:", len(a))
elif cmd == "in_flight":
    # in-flight weight updates: some completions change version mid-way, each token's version is
    # at least the rollout's first, and the rows report per-token staleness below the rollout's
    switched = 0
    for t in trajs(run):
        tv = t["extra"].get("token_versions")
        if not tv:
            fail(f"{t['episode_id']}: no extra.token_versions")
        n = len(t["turns"][0]["completion_tokens"])
        if tv[0][0] != 0 or tv[0][1] != t["turns"][0]["policy_version"]:
            fail(f"{t['episode_id']}: token_versions {tv} do not start at token 0 with the turn's version")
        if any(b[0] <= a[0] or b[1] <= a[1] or b[0] >= n for a, b in zip(tv, tv[1:])):
            fail(f"{t['episode_id']}: token_versions {tv} not increasing within {n} tokens")
        switched += len(tv) > 1
    if not switched:
        fail("no completion changed policy version mid-way")
    grpo = [r for r in rows(run) if r.get("phase") == "grpo" and "eval_accuracy" not in r]
    if not all("token_staleness_mean" in r and r["token_staleness_mean"] <= r["staleness"] for r in grpo):
        fail("a GRPO row lacks token_staleness_mean or reports more than its rollout's staleness")
    if not any(r["token_staleness_mean"] < r["staleness"] for r in grpo):
        fail("no step's tokens are fresher than its rollout's first version")
    print("in-flight:", switched, "completions switched version mid-way")
elif cmd == "ledger":
    with open(os.path.join(run, "state.json")) as f:
        state = json.load(f)
    led = state["extra"]["ledger"]
    k, n = int(sys.argv[3]), int(sys.argv[4])
    if led["trained_grpo_steps"] != k:
        fail(f"ledger trained_grpo_steps {led['trained_grpo_steps']}, expected {k}")
    steps = sorted(set(r["grpo_step"] for r in led["finished_not_trained"]))
    if steps != list(range(k, k + n)):
        fail(f"ledger finished_not_trained steps (0-based) {steps}, expected {list(range(k, k + n))}")
    if led["dispatched_not_finished"]:
        fail(f"episodes in flight at the checkpoint: {led['dispatched_not_finished']}")
    if n and "pipeline.bin" not in state["files"]:
        fail("pipeline.bin is not listed (with its CRC) in state.json")
    print("ledger:", led["trained_grpo_steps"], "steps,", led["trained_episodes"], "episodes trained;",
          len(led["finished_not_trained"]), "finished rollouts kept for steps", steps)
elif cmd in ("eval_atleast", "eval_same"):  # eval rows: a key's sum at least N; or the scores equal RUN_B's
    def evals(run_dir):
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [r for r in (json.loads(l) for l in f if l.strip()) if "eval_accuracy" in r]
    ev = evals(run)
    if not ev:
        fail("no eval rows")
    if cmd == "eval_atleast":
        key = sys.argv[3]
        n = sum(r.get(key) or 0 for r in ev)
        print(key, n)
        if n < float(sys.argv[4]):
            fail(f"eval {key} = {n} < {sys.argv[4]}")
    else:
        keys = ("step", "eval_accuracy", "eval_reward_mean", "eval_turns_mean", "eval_prompts")
        a = [{k: r.get(k) for k in keys} for r in ev]
        b = [{k: r.get(k) for k in keys} for r in evals(sys.argv[3])]
        if a != b:
            fail(f"eval rows differ: {a} vs {b}")
        print("eval rows equal:", a)
else:
    fail("unknown check " + cmd)
