#!/usr/bin/env bash
# tests/reliability cases: tiny runs (tests/reliability/tiny.yaml) whose env misbehaves on purpose
# (the faulty plug-in tests/envs/faulty_plugin.cpp, the plain-pyzmq server
# tests/envs/misbehaving_server.py); each case checks the exit code, the message and the metrics.
#   run_case.sh CASE TROUPE PYTHON SOURCE_DIR WORK_DIR LIB_DIR
set -euo pipefail
CASE=$1 TROUPE=$2 PY=$3 SRC=$4 WORK=$5 LIB=$6
CHECK="$PY $SRC/tests/reliability/check.py"
SERVER="$SRC/tests/envs/misbehaving_server.py"
W=$WORK/$CASE
rm -rf "$W" && mkdir -p "$W"
cd "$W"
CFG="$SRC/tests/reliability/tiny.yaml"
FAULTY="--set envs[0].path=$LIB/libfaulty_env.so"
# expect_exit CODE CMD...: runs CMD with its stderr in $W/err.txt; fails the case unless CMD exits CODE.
expect_exit() {
  local want=$1 rc=0
  shift
  "$@" 2> "$W/err.txt" > "$W/out.txt" || rc=$?
  if [ "$rc" = "$want" ]; then return 0; fi
  tail -n 20 "$W/out.txt" "$W/err.txt"
  echo "expected exit $want, got $rc: $*"
  exit 1
}
run() {  # run NAME CODE ARGS...: a tiny run in $W/NAME
  local name=$1 code=$2
  shift 2
  expect_exit "$code" "$TROUPE" run "$CFG" --set run.dir="$W/$name" "$@"
}
fault() { FA=(--set "envs[0].config={\"fault\": \"$1\", \"$2\": $3}"); }  # sets FA, the --set of the faulty env's config
# kill_and_resume DEATH CKPT RESUMED ARGS...: $W/killed loses learner rank 0 (SIGKILL) as GRPO step
# DEATH starts; its latest checkpoint is step CKPT, whose ledger holds the finished rollouts of the
# next two steps; --resume trains those first (steps RESUMED, "A..B") and gives the evals, metrics and
# episodes of $W/whole (the same ARGS, uninterrupted).
kill_and_resume() {
  local death=$1 ckpt=$2 resumed=$3
  shift 3
  run killed 137 "$@" --set faults.learner_death_step="$death"
  grep -q "fault injected: learner rank 0 killed as step $death starts" "$W/err.txt"
  test "$(readlink "$W/killed/checkpoints/latest")" = "step_$ckpt"
  $CHECK ledger "$W/killed/checkpoints/step_$ckpt" "$ckpt" 2
  expect_exit 0 "$TROUPE" run "$CFG" --resume "$W/killed" "$@" --set faults.learner_death_step=0
  grep -q "async resume: the rollouts of steps $resumed, finished before the checkpoint, train first" "$W/err.txt"
  $PY $SRC/tests/e2e/check_run.py same_evals "$W/whole" "$W/killed"
  $CHECK episodes_once "$W/whole" "$W/killed"
}
# start_server NAME ARGS...: the misbehaving server on a fresh ipc address ($ADDR); stopped at exit
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done' EXIT
start_server() {
  ADDR="ipc://$W/$1.sock"
  shift
  "$PY" "$SERVER" --bind "$ADDR" "$@" &
  PIDS+=($!)
  for _ in $(seq 100); do [ -S "$W/${ADDR##*/}" ] && break; sleep 0.05; done
}
REMOTE() { echo "--set envs[0].type=remote --set envs[0].path= --set envs[0].address=$ADDR"; }

case $CASE in
  reset_failures)  # resets that crash, throw or answer garbage: retried elsewhere, batch full, run ok
    for f in segfault throw badjson badutf8; do
      fault $f fault_every_reset 5; run $f 0 $FAULTY "${FA[@]}" --set envs[0].isolate=true
      $CHECK steps "$W/$f" 2
      $CHECK atleast "$W/$f" env_retries 1
      $CHECK none "$W/$f" env_failures
    done
    fault throw fault_every_reset 3; run inproc 0 $FAULTY "${FA[@]}" --set envs[0].isolate=false
    $CHECK atleast "$W/inproc" env_retries 1
    ;;
  verify_failures)  # verify that crashes / throws: with retries nothing is lost; without, counted per reason
    fault segfault fault_every_verify 6; run crash 0 $FAULTY "${FA[@]}" --set envs[0].isolate=true
    $CHECK steps "$W/crash" 2
    $CHECK atleast "$W/crash" env_retries 1
    $CHECK none "$W/crash" env_failures
    fault segfault fault_every_verify 6; run counted 0 $FAULTY "${FA[@]}" --set envs[0].max_retries=0
    $CHECK atleast "$W/counted" env_failures/worker_crash 1
    $CHECK termination "$W/counted" worker_crash
    fault throw fault_every_verify 6; run throw 0 $FAULTY "${FA[@]}" --set envs[0].max_retries=0 --set envs[0].isolate=false
    $CHECK atleast "$W/throw" env_failures/env_error 1
    $CHECK termination "$W/throw" env_error
    ;;
  step_failures)  # multi-turn: a step that crashes is replayed on a fresh worker
    fault segfault fault_every_step 5; run replay 0 $FAULTY "${FA[@]}" --set rollout.max_turns=2
    $CHECK steps "$W/replay" 2
    $CHECK atleast "$W/replay" env_retries 1
    fault badjson fault_every_step 5; run counted 0 $FAULTY "${FA[@]}" --set rollout.max_turns=2 --set envs[0].max_retries=0
    $CHECK atleast "$W/counted" env_failures/protocol_error 1
    ;;
  timeout_replaced)  # a verify that hangs: the worker is killed and replaced, the call retried
    fault hang fault_every_verify 9; run hang 0 $FAULTY "${FA[@]}" --set envs[0].timeout_s=0.5 --set envs[0].max_retries=0
    $CHECK atleast "$W/hang" env_failures/timeout 1
    $CHECK termination "$W/hang" timeout
    grep -q "no answer to verify within 0.5 s" "$W/hang/trajectories/grpo.jsonl"
    ;;
  invalid_reward)  # a reward of 1e308: that episode fails as invalid_reward, the run goes on
    fault bigreward fault_every_verify 5; run big 0 $FAULTY "${FA[@]}" --set envs[0].max_retries=0
    $CHECK atleast "$W/big" env_failures/invalid_reward 1
    $CHECK termination "$W/big" invalid_reward
    # a range of the env's own: 0.5 is above reward_max 0.25, every episode fails -> exit 3
    run range 3 $FAULTY --set envs[0].reward_max=0.25
    grep -q "invalid reward" "$W/err.txt"
    ;;
  all_failed_exit3)  # verify throws on every call: exit 3 naming the env and the reasons, never "done"
    fault throw fault_every_verify 1; run all 3 $FAULTY "${FA[@]}" --set envs[0].isolate=false
    cat "$W/err.txt"
    grep -q "env 'faulty': 32 of 32 episodes of step 1 failed after retries (env_error 32" "$W/err.txt"
    grep -q "every episode failed" "$W/err.txt"
    ! grep -q "done" "$W/out.txt"
    ;;
  failure_frac_exit3)  # more than max_failure_frac of a step's episodes fail: exit 3 naming the bound
    fault throw fault_every_verify 2; run frac 3 $FAULTY "${FA[@]}" --set envs[0].max_retries=0 --set envs[0].max_failure_frac=0.3 \
      --set envs[0].isolate=false
    grep -q "more than envs\[\].max_failure_frac 0.3" "$W/err.txt"
    fault throw fault_every_verify 2; run below 0 $FAULTY "${FA[@]}" --set envs[0].max_retries=0 --set envs[0].max_failure_frac=0.6 \
      --set envs[0].isolate=false
    $CHECK atleast "$W/below" env_failures/env_error 8
    ;;
  max_restarts_exit3)  # an env worker that keeps crashing: past envs[].max_restarts the run stops (exit 3)
    fault segfault fault_every_verify 2; run restarts 3 $FAULTY "${FA[@]}" --set envs[0].max_restarts=3
    grep -q "max_restarts (3)" "$W/err.txt"
    grep -q "Segmentation fault" "$W/err.txt"
    ;;
  plugin_struct_size)  # a table with a wrong struct_size is refused at load, naming the field (exit 2)
    for iso in true false; do
      run size_$iso 2 --set envs[0].path="$LIB/libfaulty_size8_env.so" --set envs[0].isolate=$iso
      cat "$W/err.txt"
      grep -q "field 'struct_size' is 8" "$W/err.txt"
    done
    ;;
  tokenizer_fallback)  # a prompt the char tokenizer cannot encode ("café") is mapped, never fatal
    fault nonascii fault_every_reset 1; run cafe 0 $FAULTY "${FA[@]}"
    $CHECK steps "$W/cafe" 2
    grep -q 'caf?' "$W/cafe/trajectories/grpo.jsonl"
    ;;
  remote_protocol_errors)  # a remote env's malformed replies: protocol_error, retried, counted
    for f in wrong_id extra_frames bad_utf8 not_json nan; do
      start_server $f --fault $f --op verify --every 7
      run $f 0 $(REMOTE) --set envs[0].max_retries=0 --set envs[0].timeout_s=5
      $CHECK atleast "$W/$f" env_failures/protocol_error 1
      $CHECK termination "$W/$f" protocol_error
    done
    start_server reset --fault not_json --op reset --every 3
    run reset 0 $(REMOTE)
    $CHECK steps "$W/reset" 2
    $CHECK atleast "$W/reset" env_retries 1
    ;;
  remote_hang_concurrent)  # hung calls to an address: server each fail alone at their own deadline
    # every 4th verify hangs: 8 hung calls per step (32 verify calls); waited for in turn they
    # would cost 8 x 2 s per step, concurrent about 2 s (generous bound: 7 s)
    start_server hang --fault hang --op verify --every 4
    run hang 0 $(REMOTE) --set envs[0].timeout_s=2 --set envs[0].max_retries=0
    $CHECK atleast "$W/hang" env_failures/timeout 2
    $PY - "$W/hang/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    if r.get("phase") == "grpo" and "env_s" in r:
        print("step", r["step"], "env_s", r["env_s"])
        assert r["env_s"] < 7, f"step {r['step']}: hung calls were waited for in turn ({r['env_s']} s)"
PY
    ;;
  exit_codes)  # one table: 0 ok, 2 bad config or input, 3 an env beyond its bounds, 1 other
    run ok 0 $FAULTY
    run badkey 2 $FAULTY --set envs[0].no_such_key=1
    grep -q "no_such_key" "$W/err.txt"
    run badvalue 2 $FAULTY --set envs[0].max_failure_frac=2
    expect_exit 2 "$TROUPE" run "$W/missing.yaml"
    fault throw fault_every_verify 1; run bounds 3 $FAULTY "${FA[@]}" --set envs[0].isolate=false
    # the keys envs/README.md documents are accepted
    expect_exit 0 "$TROUPE" validate "$CFG" $FAULTY --set envs[0].startup_timeout_s=20 --set envs[0].max_restarts=5 \
      --set envs[0].worker="$(dirname "$TROUPE")/troupe-env-worker" --set envs[0].max_retries=1 --set envs[0].reward_min=-2
    ;;
  command_relative)  # command: arguments relative to the YAML's folder resolve there, like path:
    mkdir -p "$W/cfg"
    cp "$SERVER" "$W/cfg/server.py"
    sed "s|type: plugin|type: remote|; s|path: ../../build/lib/libfaulty_env.so|command: [$PY, server.py, --bind, \"{bind}\"]|" \
      "$CFG" > "$W/cfg/run.yaml"
    mkdir -p "$W/elsewhere" && cd "$W/elsewhere"
    expect_exit 0 "$TROUPE" run "$W/cfg/run.yaml" --set run.dir="$W/rel"
    $CHECK steps "$W/rel" 2
    ;;
  trajectory_fields)  # trajectories: reasons, env.version, messages, components, timings, turns
    run arith 0 --set envs[0].type=builtin --set envs[0].path= --set envs[0].name=arithmetic
    $CHECK trajectories "$W/arith"
    run guess 0 --set envs[0].type=builtin --set envs[0].path= --set envs[0].name=guess_number \
      --set 'envs[0].config={"max_number": 10, "max_turns": 3}' --set rollout.max_turns=3 \
      --set policy.model.max_position_embeddings=256 --set rollout.max_prompt_length=200
    $CHECK turns "$W/guess"
    ;;
  faults_env)  # the faults: section's env faults are survived (retried), the batch stays full, and a
    # faulted run is as reproducible as any other
    ARITH="--set envs[0].type=builtin --set envs[0].path= --set envs[0].name=arithmetic --set envs[0].isolate=true"
    for k in exception crash hang malformed drop slow; do
      run $k 0 $ARITH --set faults.env_$k=0.08 --set envs[0].timeout_s=1 --set faults.env_slow_s=0.05
      n=$(grep -c "troupe: fault injected: env 'arithmetic' $k" "$W/err.txt" || true)
      echo "$k: $n faults injected"
      test "$n" -ge 1
      $CHECK steps "$W/$k" 2
      $CHECK none "$W/$k" env_failures
      [ $k = slow ] || $CHECK atleast "$W/$k" env_retries 1
    done
    run exception2 0 $ARITH --set faults.env_exception=0.08 --set envs[0].timeout_s=1
    $PY $SRC/tests/e2e/check_run.py same "$W/exception" "$W/exception2"
    # only the listed steps, only the chosen op
    run steps 0 $ARITH --set faults.env_exception=0.2 --set faults.env_steps=[2] --set faults.env_op=verify
    ! grep "fault injected" "$W/err.txt" | grep -v "in verify (step 2)"
    grep -q "fault injected: env 'arithmetic' exception in verify (step 2)" "$W/err.txt"
    # crash, hang and malformed need an env troupe reaches over a wire or runs in a worker: FILE:LINE error
    run inproc 2 $ARITH --set envs[0].isolate=false --set faults.env_crash=0.1
    grep -q "faults.env_crash.*cannot be crashed" "$W/err.txt"
    run noenv 2 $ARITH --set faults.env=nosuch --set faults.env_exception=0.1
    grep -q "no env is named 'nosuch'" "$W/err.txt"
    ;;
  faults_counted)  # without retries each injected kind is counted under its own reason
    ARITH="--set envs[0].type=builtin --set envs[0].path= --set envs[0].name=arithmetic --set envs[0].isolate=true"
    for kr in exception:env_error crash:worker_crash hang:timeout malformed:protocol_error drop:timeout; do
      k=${kr%%:*} r=${kr#*:}
      run $k 0 $ARITH --set faults.env_$k=0.1 --set faults.env_op=verify --set envs[0].max_retries=0 --set envs[0].timeout_s=1
      $CHECK atleast "$W/$k" env_failures/$r 1
      $CHECK termination "$W/$k" $r
    done
    ;;
  eval_verify_failures)  # verifies that fail during eval are retried (the eval's scores equal a fault-free
    # run's), counted per reason without retries (and left out of eval_accuracy), and past
    # max_failure_frac stop the run naming the env
    # (the faulty plug-in's verify answers reward 0.5: a failed episode scored 0 would lower the mean)
    EV="$FAULTY --set eval.at_start=true --set eval.every=1 --set eval.num_prompts=8"
    run calm 0 $EV
    run retried 0 $EV --set faults.env_exception=0.25 --set faults.env_op=verify --set envs[0].max_retries=5
    $CHECK eval_atleast "$W/retried" eval_env_retries 1
    ! grep -q eval_env_failures "$W/retried/metrics.jsonl"
    $CHECK eval_same "$W/retried" "$W/calm"
    ! grep -q eval_env_ "$W/calm/metrics.jsonl"
    run counted 0 $EV --set faults.env_exception=0.25 --set faults.env_op=verify --set envs[0].max_retries=0 \
      --set envs[0].max_failure_frac=0.9
    $CHECK eval_atleast "$W/counted" eval_env_failures/env_error 1
    $CHECK eval_same "$W/counted" "$W/calm"
    run bound 3 $EV --set faults.env_exception=0.8 --set faults.env_op=verify --set envs[0].max_retries=0
    grep -q "env 'faulty': .* episodes of the eval at step 0 failed after retries (env_error" "$W/err.txt"
    ;;
  eval_step_failures)  # multi-turn eval: a failed step replays the episode on the next worker; the eval's
    # scores equal a fault-free run's
    MT="--set envs[0].type=builtin --set envs[0].path= --set envs[0].name=guess_number --set envs[0].isolate=true
        --set envs[0].config={\"max_number\":10,\"max_turns\":3} --set rollout.max_turns=3
        --set policy.model.max_position_embeddings=256 --set rollout.max_prompt_length=200
        --set eval.at_start=true --set eval.num_prompts=8"
    run calm 0 $MT
    run retried 0 $MT --set faults.env_exception=0.15 --set faults.env_op=step --set envs[0].max_retries=5
    $CHECK eval_atleast "$W/retried" eval_env_retries 1
    $CHECK eval_same "$W/retried" "$W/calm"
    ;;
  faults_checkpoint_interrupted)  # a checkpoint write killed half-way: latest still points at the one
    # before, and --resume from it gives the uninterrupted run's metrics bit for bit
    CK="--set envs[0].type=builtin --set envs[0].path= --set envs[0].name=arithmetic --set grpo.max_steps=3
        --set checkpointing.enabled=true --set checkpointing.every=1 --set checkpointing.keep_last=5"
    run whole 0 $CK
    run cut 137 $CK --set faults.checkpoint_interrupt_step=2
    grep -q "fault injected: checkpoint of step 2 interrupted" "$W/err.txt"
    test "$(readlink "$W/cut/checkpoints/latest")" = step_1
    test ! -e "$W/cut/checkpoints/step_2"
    expect_exit 0 "$TROUPE" run "$CFG" --resume "$W/cut" $CK --set faults.checkpoint_interrupt_step=0
    $PY $SRC/tests/e2e/check_run.py same "$W/whole" "$W/cut"
    ;;
  faults_learner_death)  # the learner killed as step 2 starts (in one process: the run): --resume
    # from the last checkpoint gives the uninterrupted run's metrics bit for bit
    CK="--set envs[0].type=builtin --set envs[0].path= --set envs[0].name=arithmetic --set grpo.max_steps=3
        --set checkpointing.enabled=true --set checkpointing.every=1"
    run whole 0 $CK
    run killed 137 $CK --set faults.learner_death_step=3
    grep -q "fault injected: learner rank 0 killed as step 3 starts" "$W/err.txt"
    expect_exit 0 "$TROUPE" run "$CFG" --resume "$W/killed" $CK --set faults.learner_death_step=0
    $PY $SRC/tests/e2e/check_run.py same "$W/whole" "$W/killed"
    run badrank 2 $CK --set faults.learner_death_step=2 --set faults.learner_death_rank=1
    grep -q "faults.learner_death_rank.*only 1 learner" "$W/err.txt"
    ;;
  sigterm_checkpoint)  # SIGTERM: the step in progress finishes, is checkpointed, the run stops (exit 1)
    # within a bound; --resume goes on to the same metrics as a run never stopped
    CK="--set envs[0].type=builtin --set envs[0].path= --set envs[0].name=arithmetic --set optimizer.schedule=constant
        --set checkpointing.enabled=true --set checkpointing.every=0"
    "$TROUPE" run "$CFG" --set run.dir="$W/long" $CK --set grpo.max_steps=100000 > "$W/out.txt" 2> "$W/err.txt" &
    pid=$!
    for _ in $(seq 200); do
      [ "$(cat "$W/long/metrics.jsonl" 2> /dev/null | grep -c '"phase":"grpo"')" -ge 3 ] && break
      sleep 0.1
    done
    kill -TERM $pid
    t0=$(date +%s%N)
    rc=0; wait $pid || rc=$?
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    echo "stopped ${ms} ms after SIGTERM, exit $rc"; tail -3 "$W/err.txt"
    test $rc = 1
    test $ms -lt 20000
    grep -q "stopped by a signal after step" "$W/err.txt"
    n=$(readlink "$W/long/checkpoints/latest"); n=${n#step_}
    test "$($PY -c "import json,sys; print(max(json.loads(l)['step'] for l in open(sys.argv[1]) if 'reward_mean' in l))" "$W/long/metrics.jsonl")" = "$n"
    expect_exit 0 "$TROUPE" run "$CFG" --resume "$W/long" $CK --set grpo.max_steps=$((n + 2))
    run whole 0 $CK --set grpo.max_steps=$((n + 2))
    $PY $SRC/tests/e2e/check_run.py same "$W/whole" "$W/long"
    ;;
  async_resume)  # async (max_staleness 2, parts streamed): killed mid-run, --resume trains exactly the
    # uninterrupted run's episodes (each once, same tokens, same versions) and its metrics and evals bit
    # for bit; the checkpoint's ledger holds the finished rollouts of the next two steps; a run extended
    # with --resume and a larger grpo.max_steps is the longer run too
    AS="--set envs[0].type=builtin --set envs[0].path= --set envs[0].name=arithmetic --set rollout.async=true
        --set rollout.max_staleness=2 --set rollout.async_chunks=2 --set grpo.max_steps=7 --set eval.every=2
        --set checkpointing.enabled=true --set checkpointing.every=2 --set checkpointing.keep_last=10
        --set optimizer.schedule=constant"
    run whole 0 $AS
    kill_and_resume 6 4 5..6 $AS
    run short 0 $AS --set grpo.max_steps=3
    expect_exit 0 "$TROUPE" run "$CFG" --resume "$W/short" $AS
    $PY $SRC/tests/e2e/check_run.py same "$W/whole" "$W/short"
    $CHECK episodes_once "$W/whole" "$W/short"
    ;;
  async_in_flight_resume)  # async with in-flight weight updates (max_staleness 2, a switch every 2 decode
    # steps): token versions change mid-completion; two runs, a run with env calls delayed at random
    # and a run killed mid-way then resumed give the same metrics, evals and episodes (tokens and
    # per-token versions) bit for bit
    AS="--set envs[0].type=builtin --set envs[0].path= --set envs[0].name=arithmetic --set rollout.async=true
        --set rollout.max_staleness=2 --set rollout.in_flight_updates=true --set rollout.in_flight_every=2
        --set rollout.max_response_length=8 --set rollout.stale_policy=importance_weight --set grpo.max_steps=7
        --set eval.every=3 --set checkpointing.enabled=true --set checkpointing.every=3
        --set checkpointing.keep_last=10 --set optimizer.schedule=constant"
    run whole 0 $AS
    $CHECK in_flight "$W/whole"
    run again 0 $AS --set faults.env_slow=0.3 --set faults.env_slow_s=0.02
    $PY $SRC/tests/e2e/check_run.py same_evals "$W/whole" "$W/again"
    $CHECK episodes_once "$W/whole" "$W/again"
    kill_and_resume 5 3 4..5 $AS
    run lag2 0 $AS --set rollout.in_flight_min_lag=2  # one switch, to the version after step k - 2
    $CHECK in_flight "$W/lag2"
    ;;
  async_timing_free)  # async: which episodes train at which step, sampled by which version, does not
    # depend on timing: env calls delayed at random (faults.env_slow) give the same metrics and episodes
    AS="--set envs[0].type=builtin --set envs[0].path= --set envs[0].name=arithmetic --set rollout.async=true
        --set rollout.max_staleness=1 --set grpo.max_steps=5 --set eval.every=2"
    run calm 0 $AS
    run jittery 0 $AS --set faults.env_slow=0.3 --set faults.env_slow_s=0.05
    $PY $SRC/tests/e2e/check_run.py same_evals "$W/calm" "$W/jittery"
    $CHECK episodes_once "$W/calm" "$W/jittery"
    run chunked 0 $AS --set rollout.async_chunks=4 --set rollout.max_staleness=2
    run chunked_jittery 0 $AS --set rollout.async_chunks=4 --set rollout.max_staleness=2 --set faults.env_slow=0.3 \
      --set faults.env_slow_s=0.05
    $PY $SRC/tests/e2e/check_run.py same_evals "$W/chunked" "$W/chunked_jittery"
    ;;
  generator_death)  # one process, two generators: generator 1's thread dies as it samples step 2
    # (faults.generator_death_step); its prompts go to generator 0, the run goes on and says so, and
    # the metrics equal an undisturbed run's (same prompts, same seeds, same weights); sync and async.
    # With one generator the run stops with exit 3, the last finished step checkpointed.
    GD="--set envs[0].type=builtin --set envs[0].path= --set envs[0].name=arithmetic --set cluster.generators=2
        --set grpo.max_steps=4 --set eval.every=2"
    run calm 0 $GD
    run died 0 $GD --set faults.generator_death_step=2 --set faults.generator_death_rank=1
    grep -q "fault injected: generator 1 killed as it samples step 2" "$W/err.txt"
    grep -q "generator 1 is down (generator 1 died (fault injected)): its .* prompts go to generator 0" "$W/err.txt"
    $PY $SRC/tests/e2e/check_run.py same_evals "$W/calm" "$W/died"
    run async_calm 0 $GD --set rollout.async=true --set rollout.async_chunks=2
    run async_died 0 $GD --set rollout.async=true --set rollout.async_chunks=2 --set faults.generator_death_step=3 \
      --set faults.generator_death_rank=0
    grep -q "generator 0 is down" "$W/err.txt"
    $PY $SRC/tests/e2e/check_run.py same_evals "$W/async_calm" "$W/async_died"
    # multi-turn: a dead generator's turns go to the other one (the seed travels in the request)
    MT=(--set envs[0].name=guess_number --set 'envs[0].config={"max_number": 10, "max_turns": 3}' --set rollout.max_turns=3
        --set rollout.max_prompt_length=200 --set policy.model.max_position_embeddings=256)
    run turns_calm 0 $GD "${MT[@]}"
    run turns_died 0 $GD "${MT[@]}" --set faults.generator_death_step=2 --set faults.generator_death_rank=1
    grep -q "generator 1 is down" "$W/err.txt"
    $PY $SRC/tests/e2e/check_run.py same_evals "$W/turns_calm" "$W/turns_died"
    run alone 3 --set envs[0].type=builtin --set envs[0].path= --set envs[0].name=arithmetic --set grpo.max_steps=4 \
      --set checkpointing.enabled=true --set checkpointing.every=0 --set faults.generator_death_step=3
    grep -q "no generator is left" "$W/err.txt"
    test "$(readlink "$W/alone/checkpoints/latest")" = step_2
    run badrank 2 $GD --set faults.generator_death_step=2 --set faults.generator_death_rank=2
    grep -q "faults.generator_death_rank.*only 2 generators" "$W/err.txt"
    ;;
  bench_rows)  # `troupe bench reliability` rows: one per fault kind, nothing lost or trained twice
    "$TROUPE" bench reliability --filter env_crash > "$W/rows.jsonl"
    "$TROUPE" bench reliability --filter checkpoint_interrupt >> "$W/rows.jsonl"
    $PY - "$W/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert [r["case"] for r in rows] == ["env_crash", "checkpoint_interrupt"], rows
for r in rows:
    print(r)
    assert r["suite"] == "reliability" and r["baseline_name"] == "fault_free"
    assert r["faults_injected"] >= 1 and r["survived"] == 1 and r["resumes_bit_identical"] == 1, r
    assert r["episodes_lost"] == 0 and r["episodes_trained_twice"] == 0 and r["ratio"] == 1.0, r
PY
    ;;
  *) echo "unknown case $CASE"; exit 2 ;;
esac
echo "reliability.$CASE ok"
