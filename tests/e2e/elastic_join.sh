#!/usr/bin/env bash
# Members joining a running job over tcp on 127.0.0.1 (troupe join, troupe status).
#   elastic_join.sh CASE TROUPE PYTHON SOURCE_DIR WORK_DIR [MPIEXEC]
# CASE: join_refused_key (a joiner whose CURVE key the job does not list: refused, logged with its
# address), join_model_hash (a joiner with another model: refused naming both models),
# elastic_join (the quickstart with one generator; two join at step >= 3, each samples within 2
# steps of joining; one is killed -9, the other leaves by SIGTERM; every step and episode is
# trained exactly once, as many metric rows as an uninterrupted run),
# join_async (a generator joins an async run of two generators whose weights go down a relay tree
# of fan-out 2, samples, leaves by SIGTERM after its rollouts are trained; every step once,
# staleness within max_staleness, no relay hop failed: the member relays like the job's generators),
# join_mpirun (the same in sync mode under mpirun -np 3: learner and coordinator on rank 0, the
# generator and the env worker on ranks 1 and 2; the member reaches rank 0 only),
# join_srun (the same under srun -n 3 on a single-node SLURM started here, tests/e2e/slurm_session.sh,
# 77 = skipped without SLURM; two members join, and with weight_sync.relay_fanout 2 the job's
# generator relays the weights to the first of them: no hop fails, both leave by SIGTERM),
# expert_parallel_join, shard_join (a generator joins a sync run of 2 learners under mpirun -np 4
# whose experts are divided, or whose weights are ZeRO-3 shards: it takes the full weights from the
# learners' pieces and the run equals the data-parallel run without a member bit for bit),
# join_env (an env server joins the pool of a run's env with troupe join --role env, takes
# episodes, leaves by SIGTERM; a refused env name and address; every step trained with full batches).
set -euo pipefail
CASE=$1 TROUPE=$2 PY=$3 SRC=$4 WORK=$5 MPIEXEC=${6:-mpiexec}
CHECK="$PY $SRC/tests/e2e/check_run.py"
W=$WORK/$CASE
rm -rf "$W" && mkdir -p "$W"
cd "$W"
PIDS=()
source "$SRC/tests/e2e/slurm_session.sh"
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2> /dev/null || true; done
  slurm_session_stop
}
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
first_rollouts_at_least() { [ "$(grep -c 'sampled its first rollout' "$W/job.log" || true)" -ge "$1" ]; }
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
  join_async | join_mpirun | join_srun)
    # one member (join_srun: two) joins at step >= 3 of 40, samples, and leaves by SIGTERM (answered
    # once the work sent to it is trained); the job finishes every step once
    N=40
    LAUNCH=()
    MEMBERS=(a)
    MODE="--set rollout.async=true --set rollout.max_staleness=1 --set cluster.generators=2 --set weight_sync.relay_fanout=2"
    if [ "$CASE" = join_mpirun ]; then
      LAUNCH=("$MPIEXEC" --oversubscribe --allow-run-as-root -np 3 --mca btl self,tcp --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo)
      MODE=""
    fi
    if [ "$CASE" = join_srun ]; then
      slurm_session e2e.join_srun
      LAUNCH=(timeout 300 srun --mpi=pmix --kill-on-bad-exit=1 -n 3)
      # the job's generator and two members: more than the fan-out, so a relay tree (the job's
      # generator relays to the first member, which the job's nodes reach on 127.0.0.1)
      MODE="--set weight_sync.relay_fanout=2"
      MEMBERS=(a b)
    fi
    "${LAUNCH[@]}" "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/run" $JOIN_JOB $SLOW $MODE \
      --set grpo.max_steps=$N > "$W/job.log" 2>&1 &
    JOBPID=$!
    PIDS+=($JOBPID)
    wait_for 90 grpo_rows_at_least "$W/run" 3
    MPIDS=()
    for m in "${MEMBERS[@]}"; do
      "$TROUPE" join "$W/run" --role generator > "$W/$m.log" 2>&1 &
      MPIDS+=($!)
      PIDS+=($!)
    done
    wait_for 60 first_rollouts_at_least ${#MEMBERS[@]}
    grep "sampled its first rollout" "$W/job.log"
    if [ "$CASE" = join_srun ]; then
      [ "$(grep -c "a relay tree may pass versions through it" "$W/job.log")" -eq 2 ] || { grep membership "$W/job.log"; exit 1; }
      "$PY" -c "import json,sys; m=[r for r in json.load(open(sys.argv[1]))['members'] if 'relays' in r]; sys.exit(0 if len(m)==2 and all(r['relays'] for r in m) else 'members.json: %s' % m)" "$W/run/members.json"
      # two more steps: their syncs send deltas to all three down the tree (the job's generator relays)
      rows=$(grep -cE '"phase": ?"grpo"' "$W/run/metrics.jsonl")
      wait_for 60 grpo_rows_at_least "$W/run" $((rows + 2))
    fi
    for i in "${!MEMBERS[@]}"; do
      kill -TERM "${MPIDS[$i]}"
      wait "${MPIDS[$i]}" || { cat "$W/${MEMBERS[$i]}.log"; echo "the member did not leave cleanly"; exit 1; }
      grep -q "left the job after step" "$W/${MEMBERS[$i]}.log" || { cat "$W/${MEMBERS[$i]}.log"; exit 1; }
    done
    wait $JOBPID || { tail -30 "$W/job.log"; echo "the job failed"; exit 1; }
    grep -q "membership: generator[0-9] .* left after step" "$W/job.log" || { grep membership "$W/job.log"; exit 1; }
    $CHECK steps "$W/run" $((5 + N))
    [ "$CASE" = join_mpirun ] || $CHECK staleness "$W/run" 1
    if grep -q "did not relay" "$W/job.log"; then grep "did not relay" "$W/job.log"; exit 1; fi
    if [ "$CASE" = join_srun ]; then
      # the job's generator (rank 1) connected to a member to relay to it; it notes the member's
      # node gone once that member has left (cluster.peer_timeout_s later)
      grep -q "rank 1 (role generator0): peer node [0-9]* (role joined-relay)" "$W/job.log" ||
        { grep -E "membership|peer" "$W/job.log"; echo "the job's generator never relayed to a member"; exit 1; }
    fi
    ;;
  expert_parallel_join | shard_join)
    # 2 learners under mpirun -np 4 with the experts divided (policy.moe.expert_parallel 2, shard none;
    # shard_join: learner.shard parameters instead), sync, probe on: a generator joins at step >= 3, gets
    # the full weights assembled from the learners' expert blocks (shards) at the next sync, checksums and
    # probe passed, and samples with them. With policy.batch_invariant the run equals the data-parallel
    # run without a member bit for bit (its samples drawn with the newest weights whoever draws them).
    N=12
    MPI=("$MPIEXEC" --oversubscribe --allow-run-as-root -np 4 --mca btl self,tcp --mca btl_tcp_if_include lo
      --mca oob_tcp_if_include lo)
    HOW="--set policy.moe.expert_parallel=2"
    [ "$CASE" = shard_join ] && HOW="--set learner.shard=parameters"
    R="--set cluster.learners=2 --set weight_sync.probe=true --set policy.batch_invariant=true --set grpo.max_steps=$N"
    "${MPI[@]}" "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ref" $JOIN_JOB $R > "$W/ref.log" 2>&1 ||
      { tail -30 "$W/ref.log"; exit 1; }
    "${MPI[@]}" "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/run" $JOIN_JOB $SLOW $R $HOW \
      > "$W/job.log" 2>&1 &
    JOBPID=$!
    PIDS+=($JOBPID)
    wait_for 90 grpo_rows_at_least "$W/run" 3
    "$TROUPE" join "$W/run" --role generator > "$W/a.log" 2>&1 &
    M=$!
    PIDS+=($M)
    wait_for 60 first_rollouts_at_least 1
    grep "sampled its first rollout" "$W/job.log"
    kill -TERM $M
    wait $M || { cat "$W/a.log"; echo "the member did not leave cleanly"; exit 1; }
    grep -q "left the job after step" "$W/a.log" || { cat "$W/a.log"; exit 1; }
    wait $JOBPID || { tail -30 "$W/job.log"; echo "the job failed"; exit 1; }
    FROM="from the expert blocks of 2 learners"
    [ "$CASE" = shard_join ] && FROM="from the shards of 2 learners"
    grep -q "weight sync: $FROM" "$W/job.log" || { grep "weight sync" "$W/job.log"; exit 1; }
    if grep -E "fails its checksum|probe|not applied|refused" "$W/job.log" "$W/a.log"; then
      echo "a generator did not take the weights"
      exit 1
    fi
    # the sync that admitted the member sent the weights (in the learners' pieces) to two generators,
    # the member in full (it held none)
    "$PY" - "$W/job.log" << 'EOS'
import re, sys
rows = [tuple(map(int, m.groups())) for m in
        re.finditer(r"weight sync: version (\d+) in 2 pieces \(a delta to (\d+) generators, in full to (\d+)\)",
                    open(sys.argv[1]).read())]
two = [r for r in rows if r[1] + r[2] == 2 and r[2] >= 1]
assert two, rows
print("the member's full weights came with version", two[0][0], "from 2 learners' pieces")
EOS
    $CHECK steps "$W/run" $((5 + N))
    $CHECK same "$W/ref" "$W/run"
    ;;
  join_env)
    # tests/reliability/tiny.yaml with its env a pool of one SDK server (tests/envs/pool_env.py,
    # 0.05 s per reset); a second server joins with troupe join --role env, gets episodes, leaves
    port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
    PA=$(port) PB=$(port)
    "$PY" "$SRC/tests/envs/pool_env.py" --bind "tcp://127.0.0.1:$PA" --log "$W/a.seeds" --delay 0.05 2> "$W/a.log" &
    PIDS+=($!)
    "$PY" "$SRC/tests/envs/pool_env.py" --bind "tcp://127.0.0.1:$PB" --log "$W/b.seeds" --delay 0.05 2> "$W/b.log" &
    PIDS+=($!)
    N=30
    "$TROUPE" run "$SRC/tests/reliability/tiny.yaml" --set run.dir="$W/run" --set envs[0].name=sums \
      --set envs[0].type=remote --set envs[0].path= --set "envs[0].addresses=[tcp://127.0.0.1:$PA]" \
      --set grpo.max_steps=$N --set logger.trajectories=false --set cluster.transport=tcp --set cluster.join=true \
      --set cluster.peer_timeout_s=10 > "$W/job.log" 2>&1 &
    JOBPID=$!
    PIDS+=($JOBPID)
    wait_for 60 grpo_rows_at_least "$W/run" 2
    # refused by name: an env the job does not have, an address that is no server's
    rc=0
    "$TROUPE" join "$W/run" --role env --env nope --env-address "tcp://127.0.0.1:$PB" 2> "$W/nope.log" || rc=$?
    [ $rc -eq 2 ] && grep -q "env nope: the job has no such env (its envs: sums)" "$W/nope.log" || { cat "$W/nope.log"; exit 1; }
    rc=0
    "$TROUPE" join "$W/run" --role env --env sums --env-address "127.0.0.1:$PB" 2> "$W/bad.log" || rc=$?
    [ $rc -eq 2 ] && grep -q "'127.0.0.1:$PB' is not an env server's address" "$W/bad.log" || { cat "$W/bad.log"; exit 1; }
    "$TROUPE" join "$W/run" --role env --env sums --env-address "tcp://127.0.0.1:$PB" > "$W/member.log" 2>&1 &
    M=$!
    PIDS+=($M)
    wait_for 60 test -s "$W/b.seeds"
    grep -q "env 'sums': server tcp://127.0.0.1:$PB joined the pool" "$W/job.log" || { grep sums "$W/job.log"; exit 1; }
    "$TROUPE" status "$W/run" > "$W/status.txt"
    grep -q "env_server0" "$W/status.txt" || { cat "$W/status.txt"; exit 1; }
    kill -TERM $M
    wait $M || { cat "$W/member.log"; echo "the env server's member did not leave cleanly"; exit 1; }
    grep -q "left the job after step" "$W/member.log" || { cat "$W/member.log"; exit 1; }
    wait_for 30 grep -q "env 'sums': server tcp://127.0.0.1:$PB left the pool" "$W/job.log"
    sleep 1  # (an episode that had started there may still be verified)
    after_leave=$(wc -l < "$W/b.seeds")
    wait $JOBPID || { tail -30 "$W/job.log"; echo "the job failed"; exit 1; }
    [ "$(wc -l < "$W/b.seeds")" = "$after_leave" ] || { echo "the server that left got episodes after it left"; exit 1; }
    $CHECK steps "$W/run" $N
    "$PY" - "$W/run" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if l.strip()]
g = [r for r in rows if r["phase"] == "grpo" and "eval_accuracy" not in r]
bad = [r["step"] for r in g if r["groups_generated"] != 8 or r.get("env_failures", 0) != 0]
if bad:
    sys.exit("FAIL: steps without a full batch or with failed episodes: %s" % bad)
PYEOF
    echo "resets served: a $(wc -l < "$W/a.seeds"), b (joined, then left) $(wc -l < "$W/b.seeds")"
    ;;
  *) echo "unknown case $CASE"; exit 2 ;;
esac
echo "ok: $CASE"
