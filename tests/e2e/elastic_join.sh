#!/usr/bin/env bash
# Members joining a running job over tcp on 127.0.0.1 (troupe join, troupe status).
#   elastic_join.sh CASE TROUPE PYTHON SOURCE_DIR WORK_DIR
# CASE: join_refused_key (a joiner whose CURVE key the job does not list: refused, logged with its
# address), join_model_hash (a joiner with another model: refused naming both models),
# elastic_join (the quickstart with one generator; two join at step >= 3, each samples within 2
# steps of joining; one is killed -9, the other leaves by SIGTERM; every step and episode is
# trained exactly once, as many metric rows as an uninterrupted run).
set -euo pipefail
CASE=$1 TROUPE=$2 PY=$3 SRC=$4 WORK=$5
W=$WORK/$CASE
rm -rf "$W" && mkdir -p "$W"
cd "$W"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2> /dev/null || true; done; }
trap cleanup EXIT
# The quickstart, short, listening for members; each env call 20 ms late so that a step lasts a
# few tenths of a second (the joiners start meanwhile); dead members found within 2 s.
JOB="--set cluster.transport=tcp --set cluster.join=true --set cluster.heartbeat_s=0.2 --set cluster.peer_timeout_s=2
  --set sft.max_steps=5 --set rollout.prompts_per_step=8 --set eval.every=0 --set eval.num_prompts=20
  --set checkpointing.every=0 --set logger.progress=plain --set logger.tensorboard=false"
# the refusal cases: no member is killed, so a busy machine need not make anyone look dead
JOIN_JOB=${JOB/peer_timeout_s=2/peer_timeout_s=10}
SLOW="--set faults.env_slow=1.0 --set faults.env_slow_s=0.02"
wait_for() {  # wait_for SECONDS CMD...: until CMD succeeds
  local t=$1
  shift
  for _ in $(seq $((t * 10))); do
    if "$@" 2> /dev/null; then return 0; fi
    sleep 0.1
  done
  echo "timed out after ${t}s waiting for: $*"
  cat "$W"/*.log 2> /dev/null | tail -40
  exit 1
}
two_first_rollouts() { [ "$(grep -c 'sampled its first rollout' "$W/job.log" || true)" -ge 2 ]; }
grpo_rows_at_least() { [ "$(grep -cE '"phase": ?"grpo"' "$1/metrics.jsonl" 2> /dev/null || echo 0)" -ge "$2" ]; }

case $CASE in
  join_refused_key)
    "$TROUPE" keygen "$W/job.pub" "$W/job.key" > /dev/null
    "$TROUPE" keygen "$W/stranger.pub" "$W/stranger.key" > /dev/null
    cp "$W/job.pub" "$W/authorized"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/run" $JOIN_JOB $SLOW --set grpo.max_steps=60 \
      --set cluster.curve=true --set cluster.curve_public_key="$W/job.pub" --set cluster.curve_secret_key="$W/job.key" \
      --set cluster.curve_authorized_keys="$W/authorized" > "$W/job.log" 2>&1 &
    PIDS+=($!)
    wait_for 60 test -s "$W/run/join.json"
    rc=0
    "$TROUPE" join "$W/run" --role generator --join-timeout-s 3 --set cluster.curve_public_key="$W/stranger.pub" \
      --set cluster.curve_secret_key="$W/stranger.key" 2> "$W/joiner.log" || rc=$?
    [ $rc -eq 3 ] || { cat "$W/joiner.log"; echo "expected exit 3 from the refused joiner, got $rc"; exit 1; }
    grep -q "not in the job's authorized keys" "$W/joiner.log" || { cat "$W/joiner.log"; exit 1; }
    key=$(grep -v '^#' "$W/stranger.pub" | head -1)
    # the key is Z85 text ('[', '.', '*', ... are in its alphabet): matched as a fixed string
    grep "refused a CURVE peer from 127.0.0.1" "$W/job.log" | grep -qF -- "$key" ||
      { cat "$W/job.log"; echo "no refusal logged"; exit 1; }
    # the job's own key pair (the YAML's) is admitted
    "$TROUPE" join "$W/run" --role generator --join-timeout-s 20 > "$W/member.log" 2>&1 &
    PIDS+=($!)
    wait_for 30 grep -q "joined the job at" "$W/member.log"
    kill -TERM "${PIDS[1]}"
    wait "${PIDS[1]}" || { cat "$W/member.log"; echo "the member did not leave cleanly"; exit 1; }
    grep -q "left the job after step" "$W/member.log" || { cat "$W/member.log"; exit 1; }
    kill -TERM "${PIDS[0]}"
    wait "${PIDS[0]}" || true
    ;;
  join_model_hash)
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/run" $JOIN_JOB $SLOW --set grpo.max_steps=60 \
      > "$W/job.log" 2>&1 &
    PIDS+=($!)
    wait_for 60 test -s "$W/run/join.json"
    rc=0
    "$TROUPE" join "$W/run" --role generator --join-timeout-s 20 --set policy.model.num_hidden_layers=3 \
      2> "$W/joiner.log" || rc=$?
    [ $rc -eq 2 ] || { cat "$W/joiner.log"; echo "expected exit 2 from the joiner with another model, got $rc"; exit 1; }
    grep -q "refused.*policy.model (qwen3_moe, 3 layers, hidden 64, vocab 100).*is not the job's model policy.model (qwen3_moe, 2 layers" \
      "$W/joiner.log" || { cat "$W/joiner.log"; exit 1; }
    grep -q "membership: refused a generator" "$W/job.log" || { cat "$W/job.log"; exit 1; }
    # a wrong role and a run directory that admits no members are refused by name as well
    rc=0
    "$TROUPE" join "$W" --role generator 2> "$W/nojoin.log" || rc=$?
    [ $rc -eq 2 ] && grep -q "join.json: not found" "$W/nojoin.log" || { cat "$W/nojoin.log"; exit 1; }
    kill -TERM "${PIDS[0]}"
    wait "${PIDS[0]}" || true
    ;;
  elastic_join)
    N=40
    # the uninterrupted run: the same steps, one generator throughout
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ref" $JOB --set grpo.max_steps=$N > "$W/ref.log" 2>&1
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/run" $JOB $SLOW --set grpo.max_steps=$N \
      > "$W/job.log" 2>&1 &
    JOBPID=$!
    PIDS+=($JOBPID)
    wait_for 60 grpo_rows_at_least "$W/run" 3
    "$TROUPE" join "$W/run" --role generator > "$W/a.log" 2>&1 &
    A=$!
    PIDS+=($A)
    "$TROUPE" join "$W/run" --role generator > "$W/b.log" 2>&1 &
    B=$!
    PIDS+=($B)
    wait_for 30 two_first_rollouts
    "$TROUPE" status "$W/run" > "$W/status.txt"
    grep -q "generator2" "$W/status.txt" || { cat "$W/status.txt"; exit 1; }
    ADDR=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['address'])" "$W/run/join.json")
    "$TROUPE" status "$ADDR" --config "$W/run/config.resolved.yaml" --json > "$W/status.json"
    kill -9 $A
    wait_for 30 grep -q "is down (silent" "$W/job.log"
    kill -TERM $B
    wait $B || { cat "$W/b.log"; echo "the member did not leave cleanly"; exit 1; }
    grep -q "left the job after step" "$W/b.log" || { cat "$W/b.log"; exit 1; }
    wait $JOBPID || { tail -30 "$W/job.log"; echo "the job failed"; exit 1; }
    "$PY" "$SRC/tests/e2e/check_join.py" "$W/ref" "$W/run" "$W/job.log" "$W/status.json" $N
    ;;
  *) echo "unknown case $CASE"; exit 2 ;;
esac
echo "ok: $CASE"
