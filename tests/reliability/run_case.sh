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
      --set 'envs[0].config={"max_number": 4, "max_turns": 3}' --set rollout.max_turns=3 \
      --set policy.model.max_position_embeddings=256 --set rollout.max_prompt_length=200
    $CHECK turns "$W/guess"
    ;;
  *) echo "unknown case $CASE"; exit 2 ;;
esac
echo "reliability.$CASE ok"
