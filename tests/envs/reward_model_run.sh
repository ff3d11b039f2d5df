#!/usr/bin/env bash
# envs.reward_model_run: whole runs of configs/python_reward.yaml's tiny model with its dataset env
# scored by the tiny LlamaForSequenceClassification of tests/reward_model/llama (`type: reward_model`):
# center none (the reward is the model's score, component reward_model, and reward_model/score_mean
# and score_std its step's mean and std; same seed, same metrics;
# the model on a scorer actor, cluster.scorers 1, gives the same metrics as in the env worker, and its
# step rows carry the scorer requests' latency and batch size, scorer/reward_model/*),
# batch (each step's rewards sum to 0), a verifier and the score weighted (config.reward_weights: the
# reward their weighted sum, each logged reward/<name>), running (a --resume goes on with the
# checkpointed mean, bit for bit; also async on a scorer, with the same keys); bad paths and keys
# stop the start (exit 2) naming them.
#   reward_model_run.sh TROUPE PYTHON SOURCE_DIR WORK_DIR
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 WORK=$4
CHECK="$PY $SRC/tests/reliability/check.py"
CFG="$SRC/configs/python_reward.yaml"
RM="$SRC/tests/reward_model/llama"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
SHORT=(--set sft.enabled=false --set rollout.prompts_per_step=8 --set eval.every=0
       --set logger.tensorboard=false --set logger.progress=plain --set logger.trajectories_per_step=64)
ROWS='"train": "data/python_reward_train.jsonl", "template": "{question}="'
run() {  # run CODE NAME ARGS...: troupe run with ARGS in $WORK/NAME, must exit CODE
  local want=$1 name=$2 rc=0
  shift 2
  "$TROUPE" run "$CFG" "${SHORT[@]}" --set run.dir="$WORK/$name" "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" || rc=$?
  if [ "$rc" != "$want" ]; then
    tail -n 20 "$WORK/$name.out" "$WORK/$name.err"
    echo "FAIL: $name: expected exit $want, got $rc"
    exit 1
  fi
}
rm_env() {  # rm_env CENTER: the env entry's overrides, in RMA
  RMA=(--set envs[0].type=reward_model --set "envs[0].path=$RM" --set "envs[0].config={$ROWS, \"center\": \"$1\"}")
}

# 1. center none: the score is the reward; a second run with the same seed logs the same metrics
rm_env none
run 0 none "${RMA[@]}" --set grpo.max_steps=3 --set checkpointing.enabled=false
run 0 none2 "${RMA[@]}" --set grpo.max_steps=3 --set checkpointing.enabled=false
$CHECK none "$WORK/none" env_failures
# ... and with the model on a scorer (cluster.scorers 1, ScoreReq sequence_score): the same metrics
run 0 scorer "${RMA[@]}" --set grpo.max_steps=3 --set checkpointing.enabled=false --set cluster.scorers=1
"$TROUPE" report "$WORK/scorer" > /dev/null  # the frozen models' panel: reward_model/score_mean, scorer/reward_model/latency_s
test -s "$WORK/scorer/report.png"
# 2. center batch: every step's scored rewards sum to 0; the raw score stays the component
rm_env batch
run 0 batch "${RMA[@]}" --set grpo.max_steps=3 --set checkpointing.enabled=false
# 2b. several reward sources: a verifier and the score, weighted (config.reward_weights)
run 0 weighted --set envs[0].type=reward_model --set "envs[0].path=$RM" --set grpo.max_steps=2 \
  --set checkpointing.enabled=false \
  --set "envs[0].config={$ROWS, \"verifier\": \"numeric\", \"extract\": \"last_number\", \"reward_weights\": {\"verifier\": 1, \"reward_model\": 0.5}}"
# 3. center running: 4 steps at once, and 2 steps then --resume to 4 (checkpoint every 2)
rm_env running
RMA+=(--set optimizer.schedule=constant)
run 0 running "${RMA[@]}" --set grpo.max_steps=4 --set checkpointing.every=2
run 0 resumed "${RMA[@]}" --set grpo.max_steps=2 --set checkpointing.every=2
"$TROUPE" run "$CFG" --resume "$WORK/resumed" "${SHORT[@]}" "${RMA[@]}" --set checkpointing.every=2 --set grpo.max_steps=4 > "$WORK/resumed2.out" 2> "$WORK/resumed2.err" || {
  tail -n 20 "$WORK/resumed2.err"; echo "FAIL: resume"; exit 1; }
$PY - "$WORK" << 'PYEOF'
import glob, json, math, os, sys
work = sys.argv[1]
SKIP = {"wall_s", "step_s", "gen_s", "env_s", "learner_s", "weight_sync_s", "idle_s", "learner_idle_s",
        "tokens_per_s", "process_cpu_s", "version_wait_s"}
def steps(run):
    rows = [json.loads(l) for l in open(os.path.join(work, run, "metrics.jsonl")) if l.strip()]
    return [r for r in rows if r.get("phase") == "grpo" and "reward_mean" in r]
def same(a, b, what):
    assert len(a) == len(b), (what, len(a), len(b))
    for x, y in zip(a, b):
        for k in x:
            if k in SKIP or k.endswith(("_s", "batch_requests", "batch_requests_max")):
                continue
            assert x[k] == y.get(k), (what, x["step"], k, x[k], y.get(k))
def trajs(run):
    return [json.loads(l) for p in sorted(glob.glob(os.path.join(work, run, "trajectories", "*.jsonl")))
            for l in open(p) if l.strip()]
# none: reward == the reward_model component; identical reruns
t = trajs("none")
assert t and all(set(x["reward_components"]) == {"reward_model"} for x in t), t[0]["reward_components"]
assert all(x["reward"] == x["reward_components"]["reward_model"] for x in t)
assert len({x["reward"] for x in t}) > 8, "scores should vary"
assert len(steps("none")) == 3
same(steps("none"), steps("none2"), "rerun")
# each step's reward/reward_model: the mean raw score of its scored responses
for r in steps("none"):
    xs = [x["reward_components"]["reward_model"] for x in t if x["step"] == r["step"]]
    assert abs(r["reward/reward_model"] - sum(xs) / len(xs)) < 1e-6, (r["step"], r.get("reward/reward_model"))
    # reward_model/score_mean and score_std: the raw scores' mean and population std
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
    assert abs(r["reward_model/score_mean"] - m) < 1e-9, (r["step"], r.get("reward_model/score_mean"), m)
    assert abs(r["reward_model/score_std"] - sd) < 1e-9, (r["step"], r.get("reward_model/score_std"), sd)
    assert sd > 0, "scores should vary within a step"
same(steps("none"), steps("scorer"), "scorer")
# on the scorer, each step row carries its requests' latency and batch size (scorer/reward_model/*,
# timing, so left out of the comparisons); in the env worker's own copy, none
for r in steps("scorer"):
    lat, top = r["scorer/reward_model/latency_s"], r["scorer/reward_model/latency_max_s"]
    assert 0 < lat <= top < 300, (r["step"], lat, top)
    assert 1 <= r["scorer/reward_model/batch_requests"] <= r["scorer/reward_model/batch_requests_max"] <= 8, r
assert not any(k.startswith("scorer/") for r in steps("none") for k in r), sorted(steps("none")[0])
# batch: each step's rewards sum to 0, and reward - raw score is one constant per step
by_step = {}
for x in trajs("batch"):
    by_step.setdefault(x["step"], []).append(x)
assert len(by_step) == 3, sorted(by_step)
for step, xs in by_step.items():
    assert len(xs) == 64, (step, len(xs))
    assert abs(sum(x["reward"] for x in xs)) < 1e-9, (step, sum(x["reward"] for x in xs))
    shifts = {round(x["reward_components"]["reward_model"] - x["reward"], 9) for x in xs}
    assert len(shifts) == 1, shifts
# batch: reward_model/score_mean is the raw scores' mean (the shift), not the centred rewards' 0
for r in steps("batch"):
    raw = [x["reward_components"]["reward_model"] for x in by_step[r["step"]]]
    assert abs(r["reward_model/score_mean"] - sum(raw) / len(raw)) < 1e-9, (r["step"], r["reward_model/score_mean"])
# weighted: each reward is verifier + 0.5 x the raw score; every source logged as reward/<name>
tw = trajs("weighted")
assert tw and all(set(x["reward_components"]) == {"verifier", "correct", "reward_model"} for x in tw), tw[0]
for x in tw:
    c = x["reward_components"]
    assert abs(x["reward"] - (c["verifier"] + 0.5 * c["reward_model"])) < 1e-9, x
for r in steps("weighted"):
    xs = [x for x in tw if x["step"] == r["step"]]
    for name in ("verifier", "reward_model"):
        m = sum(x["reward_components"][name] for x in xs) / len(xs)
        assert abs(r["reward/" + name] - m) < 1e-9, (r["step"], name, r.get("reward/" + name), m)
    assert abs(r["accuracy"] - sum(x["reward_components"]["correct"] for x in xs) / len(xs)) < 1e-9, r
# running: the resumed run's steps 3-4 equal the uninterrupted run's, and state.json holds the mean
same(steps("running")[2:], [r for r in steps("resumed") if r["step"] > 2], "resume")
st = json.load(open(os.path.join(work, "resumed", "checkpoints", "step_2", "state.json")))

found = json.dumps(st)
assert "reward_centering" in found and "\"count\": 128" in found, found[:600]
print("reward_model_run: none, batch, weighted, running ok")
PYEOF

# troupe eval of the running run's checkpoint: with cluster.scorers 1 it starts a scorer itself, and
# scores as the env worker's own copy of the model does (cluster.scorers 0), bit for bit
rm_env none
for n in 0 1; do
  "$TROUPE" eval "$CFG" --checkpoint "$WORK/running/checkpoints/latest" "${SHORT[@]}" "${RMA[@]}" \
    --set eval.num_prompts=8 --set cluster.scorers=$n > "$WORK/eval$n.json" 2> "$WORK/eval$n.err" || {
    tail -n 20 "$WORK/eval$n.err"; echo "FAIL: eval with cluster.scorers=$n"; exit 1; }
done
$PY - "$WORK/eval0.json" "$WORK/eval1.json" << 'PYEOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert "eval_reward_mean" in a and a["eval_reward_mean"] == b["eval_reward_mean"], (a, b)
print("eval: the same eval_reward_mean with and without a scorer:", a["eval_reward_mean"])
PYEOF

# 3b. async (max_staleness 1) on a scorer, center running: 4 steps at once, and 2 steps then --resume
# to 4: every non-timing value bit for bit and the same keys (scorer/reward_model/* kept with the
# checkpoint's finished rollouts, the running mean with the draws)
rm_env running
A=("${RMA[@]}" --set optimizer.schedule=constant --set rollout.async=true --set rollout.max_staleness=1
   --set cluster.scorers=1 --set checkpointing.every=2)
run 0 async "${A[@]}" --set grpo.max_steps=4
run 0 async_resumed "${A[@]}" --set grpo.max_steps=2
"$TROUPE" run "$CFG" --resume "$WORK/async_resumed" "${SHORT[@]}" "${A[@]}" --set grpo.max_steps=4 \
  > "$WORK/async_resumed2.out" 2> "$WORK/async_resumed2.err" || { tail -n 20 "$WORK/async_resumed2.err"; echo "FAIL: async resume"; exit 1; }
grep -q "finished before the checkpoint, train first" "$WORK/async_resumed2.err" "$WORK/async_resumed2.out"
$PY "$SRC/tests/e2e/check_run.py" same "$WORK/async" "$WORK/async_resumed"
$PY "$SRC/tests/e2e/check_run.py" same_keys "$WORK/async" "$WORK/async_resumed"
grep -q '"scorer/reward_model/latency_s"' "$WORK/async_resumed/metrics.jsonl"

# 4. bad inputs: exit 2 at start naming the path or key
run 2 nodir --set envs[0].type=reward_model --set envs[0].path=/nonexistent/rm --set "envs[0].config={$ROWS}"
grep -q "envs\[0\].path: the reward model directory /nonexistent/rm does not exist" "$WORK/nodir.err"
run 2 causal --set envs[0].type=reward_model --set "envs[0].path=$SRC/tests/hf_fixture/llama" --set "envs[0].config={$ROWS}"
grep -q "tests/hf_fixture/llama/config.json: key 'architectures' is 'LlamaForCausalLM'" "$WORK/causal.err"
rm_env median
run 2 center "${RMA[@]}"
grep -q "envs\[0\].config.center" "$WORK/center.err"
run 2 nopath --set envs[0].type=reward_model --set "envs[0].config={$ROWS}"
grep -q "envs\[0\].path" "$WORK/nopath.err"
rm_env none
run 2 badweight --set envs[0].type=reward_model --set "envs[0].path=$RM" \
  --set "envs[0].config={$ROWS, \"reward_weights\": {\"judge\": 1}}"
grep -q "reward_weights.judge names no reward component (this env's are: reward_model)" "$WORK/badweight.err"
run 2 turns "${RMA[@]}" --set rollout.max_turns=2
grep -q "rollout.max_turns: must be 1 with a reward_model env (env '.*'): a reward model scores single-turn responses" "$WORK/turns.err"
echo "reward_model_run: all cases passed"
