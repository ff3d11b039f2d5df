#!/usr/bin/env bash
# tests/e2e cases: short runs of the committed configs through the real `troupe` binary.
#   run_case.sh CASE TROUPE PYTHON SOURCE_DIR WORK_DIR [MPIEXEC]
set -euo pipefail
CASE=$1 TROUPE=$2 PY=$3 SRC=$4 WORK=$5 MPIEXEC=${6:-mpirun}
CHECK="$PY $SRC/tests/e2e/check_run.py"
W=$WORK/$CASE
rm -rf "$W" && mkdir -p "$W"
cd "$W"
Q="--set logger.progress=plain"
# expect_exit CODE CMD...: runs CMD with its stderr in $W/err.txt; the case fails, showing that
# stderr, unless CMD exits CODE ("nonzero": any failure). set -e does not stop at CMD's failure.
expect_exit() {
  local want=$1 rc=0
  shift
  "$@" 2> "$W/err.txt" || rc=$?
  if [ "$want" = nonzero ] && [ $rc -ne 0 ]; then return 0; fi
  if [ "$rc" = "$want" ]; then return 0; fi
  cat "$W/err.txt"
  echo "expected exit $want, got $rc: $*"
  exit 1
}
# rank_wrapper: $W/rank.sh runs a rank's command, recording its pid ($W/pid_RANK) and exit code ($W/rc_RANK)
# (RANK: mpirun's rank, else srun's task id)
rank_wrapper() {
  cat > "$W/rank.sh" << 'EOS'
r=${OMPI_COMM_WORLD_RANK:-$SLURM_PROCID}
"$@" &
echo $! > "$RANKDIR/pid_$r"
wait $!
echo $? > "$RANKDIR/rc_$r"
EOS
  export RANKDIR="$W"
}
# restarted_once JOB: the supervised run JOB (44 steps, a checkpoint every 2; ranks' pids from
# rank_wrapper) has its learner rank 1 SIGKILLed after the first checkpoint; the supervisor must log
# the restart with its cause and finish with every step's row exactly once
restarted_once() {
  for i in $(seq 1 480); do
    [ -e "$W/run/checkpoints/latest" ] && [ -s "$W/pid_1" ] && break
    sleep 0.25
  done
  test -e "$W/run/checkpoints/latest"
  kill -9 "$(cat "$W/pid_1")"
  wait "$1" || { echo "the supervised run exited $?"; grep -v PMIX "$W/err.txt" | tail -20; exit 1; }
  grep "troupe: restart" "$W/err.txt"
  grep -q "restart 1 of 1: the job failed (it exited with code" "$W/err.txt"
  grep -q "restart 1 of 1" "$W/run/logs/restarts.log"
  $CHECK steps "$W/run" 44
}
# start_slurm TEST: a single-node SLURM for this case (tests/e2e/slurm_session.sh), stopped when the
# case ends; without SLURM the case is skipped (exit 77)
source "$SRC/tests/e2e/slurm_session.sh"
start_slurm() {
  trap 'slurm_session_stop' EXIT
  trap 'exit 143' TERM INT
  slurm_session "$1"
}

case $CASE in
  quickstart_short)  # the README's main command, shortened: reward and held-out accuracy must rise
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/run" --set grpo.max_steps=200 \
      --set eval.every=0 --set eval.num_prompts=200 --set checkpointing.every=0 $Q
    $CHECK learned "$W/run"
    $CHECK files "$W/run"
    "$TROUPE" eval "$SRC/configs/quickstart.yaml" --checkpoint "$W/run/checkpoints/latest" \
      --set eval.num_prompts=50 > "$W/eval.json"
    $CHECK eval_json "$W/eval.json"
    "$TROUPE" report "$W/run"
    test -s "$W/run/report.png"
    ;;
  resume)  # 2N steps == N steps + --resume + N steps, bit for bit (CPU, sync); also on 1 thread, generator_nice 19
    # constant lr: a cosine schedule depends on grpo.max_steps, which the first half changes
    S="--set optimizer.schedule=constant --set sft.max_steps=20 --set eval.every=0 --set eval.num_prompts=20 --set checkpointing.every=10 $Q"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/a" --set grpo.max_steps=10 $S
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/b" --set grpo.max_steps=5 $S
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/b" --set grpo.max_steps=10 $S
    $CHECK same "$W/a" "$W/b"
    # one compute thread instead of the cores, and the generator sampling on its own nice-19 thread,
    # change timing, never a number (GEMMs are cut into fixed row blocks: kernels/README.md)
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/c" --set grpo.max_steps=10 \
      --set cluster.threads=1 --set cluster.generator_nice=19 $S
    $CHECK same "$W/a" "$W/c"
    # keep_best_by (eval_accuracy): evals every 7 steps, checkpoints every 10; the best eval is kept
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/d" --set grpo.max_steps=10 --set sft.max_steps=20 \
      --set eval.every=7 --set eval.num_prompts=20 --set checkpointing.every=10 --set checkpointing.keep_last=1 $Q
    $CHECK best "$W/d"
    # a fresh run into a used run.dir is refused (exit 2)
    expect_exit 2 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/a" $S
    grep -q "already holds a run" "$W/err.txt"
    # a --resume that would change what is trained is refused, and so is one from a corrupt
    # checkpoint (naming the file and the earlier whole checkpoints); neither touches the run directory
    before=$(md5sum "$W/b/metrics.jsonl" "$W/b/config.resolved.yaml")
    expect_exit 2 "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/b" --set grpo.max_steps=12 \
      --set loss.kl_coef=0.05 $S
    cat "$W/err.txt"
    grep -q "loss.kl_coef: 0.0 (the run) -> 0.05" "$W/err.txt"
    latest=$(readlink -f "$W/b/checkpoints/latest")
    printf 'XX' | dd of="$latest/model.safetensors" bs=1 seek=100 conv=notrunc 2> /dev/null
    expect_exit 2 "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/b" --set grpo.max_steps=12 $S
    cat "$W/err.txt"
    grep -q "model.safetensors fails its checksum" "$W/err.txt"
    grep -q "nothing in the run directory was changed" "$W/err.txt"
    test "$(md5sum "$W/b/metrics.jsonl" "$W/b/config.resolved.yaml")" = "$before"
    # going on from the earlier checkpoint the error names: the steps continue from there
    earlier=$(sed -n 's/.*ln -sfn \(step_[0-9]*\) .*/\1/p' "$W/err.txt")
    test -n "$earlier"
    ln -sfn "$earlier" "$W/b/checkpoints/latest"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/b" --set grpo.max_steps=12 $S
    $CHECK steps "$W/b" 32
    ;;
  async)  # each step's parts streamed to the learner (async_chunks 4); same seed, same metrics
    S="--set sft.max_steps=30 --set grpo.max_steps=30 --set eval.num_prompts=50 $Q"
    "$TROUPE" run "$SRC/configs/async.yaml" --set run.dir="$W/run" $S
    $CHECK staleness "$W/run" 1
    $CHECK files "$W/run"
    "$TROUPE" run "$SRC/configs/async.yaml" --set run.dir="$W/again" $S
    $CHECK same "$W/run" "$W/again"
    $CHECK moved "$W/run"
    # --resume in async mode: the pipeline refills from the checkpoint and the steps continue
    R="--set sft.max_steps=10 --set eval.every=0 --set eval.num_prompts=10 --set checkpointing.every=5 $Q"
    "$TROUPE" run "$SRC/configs/async.yaml" --set run.dir="$W/resumed" --set grpo.max_steps=5 $R
    "$TROUPE" run "$SRC/configs/async.yaml" --resume "$W/resumed" --set grpo.max_steps=10 $R
    $CHECK steps "$W/resumed" 20
    $CHECK staleness "$W/resumed" 1
    # stale_policy importance_weight: decoupled PPO with the truncated importance weight
    "$TROUPE" run "$SRC/configs/async.yaml" --set run.dir="$W/iw" --set rollout.stale_policy=importance_weight $S
    $CHECK staleness "$W/iw" 1
    $CHECK moved "$W/iw"
    $PY -c "
import json, sys
g = [json.loads(l) for l in open(sys.argv[1] + '/metrics.jsonl')]
w = [r['is_weight_mean'] for r in g if r.get('phase') == 'grpo' and 'is_weight_mean' in r]
print('is_weight_mean per step: min %.4f max %.4f' % (min(w), max(w)))
assert len(w) == 30 and all(0 < x <= 2 for x in w) and max(abs(x - 1) for x in w) > 1e-4, w" "$W/iw"
    ;;
  countdown)
    "$TROUPE" run "$SRC/configs/countdown.yaml" --set run.dir="$W/run" --set sft.max_steps=5 --set grpo.max_steps=3 \
      --set eval.num_prompts=10 $Q
    $CHECK files "$W/run"
    ;;
  multi_env)
    "$TROUPE" run "$SRC/configs/multi_env.yaml" --set run.dir="$W/run" --set sft.max_steps=5 --set grpo.max_steps=4 \
      --set eval.num_prompts=10 --set "envs[1].path=$(dirname "$TROUPE")/../lib/libreverse_env.so" $Q
    $CHECK files "$W/run"
    grep -q '"reward_mean/reverse"' "$W/run/metrics.jsonl"
    grep -q '"eval_accuracy/reverse"' "$W/run/metrics.jsonl"
    # prompts follow the weights (arithmetic 3 : reverse 1)
    $PY -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + '/metrics.jsonl')]
n = {e: sum(r.get('prompts/' + e, 0) for r in rows) for e in ('arithmetic', 'reverse')}
frac = n['arithmetic'] / (n['arithmetic'] + n['reverse'])
print('prompts per env', n, 'arithmetic share %.2f (weight share 0.75)' % frac)
sys.exit(0 if abs(frac - 0.75) < 0.15 else 1)" "$W/run"
    ;;
  multinode)  # roles on 4 ranks over tcp 127.0.0.1; async with parts streamed to 2 learner ranks
    "$MPIEXEC" --oversubscribe --allow-run-as-root -np 4 --mca btl self,tcp --mca btl_tcp_if_include lo \
      --mca oob_tcp_if_include lo "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/run" \
      --set sft.max_steps=5 --set grpo.max_steps=3 --set eval.num_prompts=10 $Q
    $CHECK files "$W/run"
    "$MPIEXEC" --oversubscribe --allow-run-as-root -np 4 --mca btl self,tcp --mca btl_tcp_if_include lo \
      --mca oob_tcp_if_include lo "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/async" \
      --set rollout.async=true --set rollout.async_chunks=2 --set cluster.transport=ipc --set sft.max_steps=3 \
      --set grpo.max_steps=4 --set eval.num_prompts=10 $Q
    $CHECK staleness "$W/async" 1
    # cluster.curve: tcp between the ranks encrypted and authenticated (one key pair for all ranks here;
    # on real nodes each has its own and the authorized-keys file lists them all)
    "$TROUPE" keygen "$W/rank.pub" "$W/rank.sec" > "$W/authorized_keys"
    test "$(stat -c %a "$W/rank.sec")" = 600
    "$MPIEXEC" --oversubscribe --allow-run-as-root -np 4 --mca btl self,tcp --mca btl_tcp_if_include lo \
      --mca oob_tcp_if_include lo "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/curve" \
      --set cluster.curve=true --set cluster.curve_public_key="$W/rank.pub" --set cluster.curve_secret_key="$W/rank.sec" \
      --set cluster.curve_authorized_keys="$W/authorized_keys" --set sft.max_steps=3 --set grpo.max_steps=2 \
      --set eval.num_prompts=10 $Q
    $CHECK steps "$W/curve" 5
    ;;
  sigterm_mpi)  # under mpirun, SIGTERM to one rank (not rank 0): rank 0 finishes the step in progress,
    # checkpoints it and ends the run (exit 1) within a bound, every rank stops; --resume gives the
    # metrics of a run never stopped. (SIGTERM to mpirun itself is Open MPI's own teardown: it
    # SIGKILLs the ranks odls_base_sigkill_timeout later, and is not tested here.)
    rank_wrapper
    MR="$MPIEXEC --oversubscribe --allow-run-as-root -x RANKDIR -np 4 --mca btl self,tcp --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo --mca odls_base_sigkill_timeout 20"
    ST="--set sft.max_steps=3 --set eval.every=0 --set eval.num_prompts=10 --set checkpointing.every=0
        --set optimizer.schedule=constant $Q"
    grpo_rows() { grep -c '"phase":"grpo"' "$1/metrics.jsonl" 2> /dev/null || true; }
    # stop_run DIR TARGET: a long run, SIGTERM to rank TARGET's troupe (or to mpirun) once it logged
    # 3 GRPO steps; every rank must stop within 60 s, rank 0 (or mpirun) with exit 1, and `latest`
    # must be the last logged step
    stop_run() {
      rm -f "$W"/pid_* "$W"/rc_*
      if [ "$2" = mpirun ]; then  # (no wrapper: mpirun signals its children, the ranks themselves)
        $MR --output-filename "$W/out_$1" "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/$1" --set grpo.max_steps=100000 $ST \
          2> "$W/err_$1.txt" &
      else
        $MR bash "$W/rank.sh" "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/$1" \
          --set grpo.max_steps=100000 $ST 2> "$W/err_$1.txt" &
      fi
      job=$!
      for i in $(seq 1 240); do
        [ "$(grpo_rows "$W/$1")" -ge 3 ] 2> /dev/null && { [ "$2" = mpirun ] || [ -s "$W/pid_3" ]; } && break
        sleep 0.25
      done
      if [ "$2" = mpirun ]; then kill -TERM $job; else kill -TERM "$(cat "$W/pid_$2")"; fi
      t0=$(date +%s)
      rc=0; wait $job || rc=$?
      echo "$1: every rank stopped $(( $(date +%s) - t0 )) s after SIGTERM to $2 (mpirun exit $rc)"
      test $(( $(date +%s) - t0 )) -lt 70
      grep -v PMIX "$W/err_$1.txt" | grep -i "sigterm\|stopped by" | head -6
      if [ "$2" = mpirun ]; then test $rc = 1; else test "$(cat "$W/rc_0")" = 1; fi
      cat "$W"/out_$1/1/rank.*/stderr >> "$W/err_$1.txt" 2> /dev/null || true  # (mpirun stops forwarding output)
      grep -q "stopped by a signal after step" "$W/err_$1.txt"
      n=$(readlink "$W/$1/checkpoints/latest"); n=${n#step_}
      last=$($PY -c "import json,sys; print(max(json.loads(l)['step'] for l in open(sys.argv[1]) if 'reward_mean' in l))" "$W/$1/metrics.jsonl")
      test "$last" = "$n" || { echo "latest checkpoint step_$n, last logged step $last"; exit 1; }
    }
    stop_run rank 2
    grep -q "rank 2: SIGTERM: asking rank 0 to stop after the step in progress" "$W/err_rank.txt"
    $MR "$TROUPE" run "$SRC/configs/multinode.yaml" --resume "$W/rank" --set grpo.max_steps=$((n - 3 + 2)) $ST
    $MR "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/whole" --set grpo.max_steps=$((n - 3 + 2)) $ST
    $CHECK same "$W/whole" "$W/rank"
    ;;
  restart)  # troupe run --restarts 1 --launcher "mpirun ...": learner rank 1 is SIGKILLed after a checkpoint;
    # the supervisor (outside mpirun) logs the restart with its cause and starts the job again with
    # --resume from the latest checkpoint, which finishes: every step's row exactly once
    # each rank's pid in $W/pid_RANK; the wrapper exits with the rank's code, so mpirun sees the failure
    printf '"$@" &\necho $! > "$RANKDIR/pid_$OMPI_COMM_WORLD_RANK"\nwait $!\n' > "$W/rank.sh"
    export RANKDIR="$W"
    M="$MPIEXEC --oversubscribe --allow-run-as-root -x RANKDIR -np 4 --mca btl self,tcp --mca btl_tcp_if_include lo \
       --mca oob_tcp_if_include lo bash $W/rank.sh"
    "$TROUPE" run "$SRC/configs/multinode.yaml" --restarts 1 --launcher "$M" --set run.dir="$W/run" \
      --set sft.max_steps=4 --set grpo.max_steps=40 --set eval.every=0 --set eval.num_prompts=10 \
      --set checkpointing.every=2 --set cluster.peer_timeout_s=5 $Q 2> "$W/err.txt" &
    restarted_once $!
    # inside mpirun the supervisor is refused, naming the way to start it
    expect_exit nonzero $MPIEXEC --oversubscribe --allow-run-as-root -np 1 "$TROUPE" run "$SRC/configs/quickstart.yaml" \
      --restarts 1 --set run.dir="$W/bad"
    grep -q "the supervisor runs outside mpirun/srun" "$W/err.txt"
    expect_exit 2 "$TROUPE" run "$SRC/configs/quickstart.yaml" --launcher "mpirun -np 2" --set run.dir="$W/bad"
    grep -q "\-\-launcher needs \-\-restarts N > 0" "$W/err.txt"
    ;;
  restart_yaml)  # run.restarts and run.launcher in the YAML (the flags' equivalents), srun as the launcher: a
    # stand-in srun ($W/bin/srun: skips its options, runs the task, exits as srun does: the task's code,
    # 128 + N for a task killed by signal N) starts the one process; it is SIGKILLed after a checkpoint; the
    # supervisor logs the restart with its cause and resumes from the checkpoint: every step's row exactly once
    mkdir -p "$W/bin"
    cat > "$W/bin/srun" << 'EOS'
#!/usr/bin/env bash
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do case $1 in -n|-N|--ntasks|--nodes) shift 2 ;; *) shift ;; esac; done
export SLURM_STEP_NUM_TASKS=1 SLURM_PROCID=0
"$@" &
echo $! > "$SRUNDIR/task_pid"
wait $!
rc=$?
echo "srun task exit $rc" >> "$SRUNDIR/srun_log"
exit $rc
EOS
    chmod +x "$W/bin/srun"
    export SRUNDIR="$W"
    sed "/^run:/a\\  restarts: 1\\n  launcher: $W/bin/srun --mpi=pmix -n 1" "$SRC/configs/quickstart.yaml" > "$W/restart.yaml"
    grep -q "restarts: 1" "$W/restart.yaml"
    "$TROUPE" run "$W/restart.yaml" --set run.dir="$W/run" --set sft.max_steps=4 --set grpo.max_steps=40 \
      --set eval.every=0 --set eval.num_prompts=10 --set checkpointing.every=2 $Q 2> "$W/err.txt" &
    job=$!
    for i in $(seq 1 240); do
      [ -e "$W/run/checkpoints/latest" ] && [ -s "$W/task_pid" ] && break
      sleep 0.25
    done
    test -e "$W/run/checkpoints/latest"
    kill -9 "$(cat "$W/task_pid")"
    wait $job || { echo "the supervised run exited $?"; tail -20 "$W/err.txt"; exit 1; }
    grep "troupe: restart" "$W/err.txt"
    grep -q "restart 1 of 1: the job failed (it exited with code 137: a rank was killed by signal 9" "$W/err.txt"
    grep -q "starting it again from step_" "$W/run/logs/restarts.log"
    grep -q "srun task exit 137" "$W/srun_log"
    $CHECK steps "$W/run" 44
    # the flag overrides the key: --restarts 0 runs the job without a supervisor (and without the launcher)
    expect_exit 0 "$TROUPE" run "$W/restart.yaml" --restarts 0 --set run.dir="$W/plain" --set sft.max_steps=1 \
      --set grpo.max_steps=1 --set eval.every=0 --set eval.num_prompts=10 --set checkpointing.every=0 $Q
    [ "$(grep -c "srun task exit" "$W/srun_log")" = 2 ]
    # a launcher without restarts is refused, naming the key and its line
    sed "/^run:/a\\  launcher: srun -n 4" "$SRC/configs/quickstart.yaml" > "$W/no_restarts.yaml"
    expect_exit 2 "$TROUPE" validate "$W/no_restarts.yaml"
    grep -q "no_restarts.yaml:10:[0-9]*: error: run.launcher: the launcher is for the supervisor of run.restarts" "$W/err.txt"
    ;;
  dead_rank)  # the env worker's rank is SIGKILLed mid-GRPO: the survivors name it (rank, role) within
    # peer_timeout_s, rank 0 checkpoints the last finished step and every survivor exits 3 (an env
    # rank is never asked during an update, so the learners always hold a finished step's state)
    # (mpirun --enable-recovery: else mpirun kills the job itself; it then returns 0, the ranks' codes are what count)
    rank_wrapper
    "$MPIEXEC" --oversubscribe --allow-run-as-root --enable-recovery -x RANKDIR -np 4 --mca btl self,tcp \
      --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo bash "$W/rank.sh" "$TROUPE" run "$SRC/configs/multinode.yaml" \
      --set run.dir="$W/run" --set sft.max_steps=5 --set grpo.max_steps=100000 --set eval.every=0 \
      --set eval.num_prompts=10 --set checkpointing.every=0 --set cluster.peer_timeout_s=5 $Q 2> "$W/err.txt" &
    job=$!
    for i in $(seq 1 120); do
      grep -q '"phase":"grpo"' "$W/run/metrics.jsonl" 2> /dev/null && [ -s "$W/pid_3" ] && break
      sleep 0.5
    done
    grep -q '"phase":"grpo"' "$W/run/metrics.jsonl"
    kill -9 "$(cat "$W/pid_3")"
    t0=$(date +%s)
    wait $job || true
    echo "survivors finished $(( $(date +%s) - t0 )) s after the kill"
    grep -v PMIX "$W/err.txt" | tail -6
    for r in 0 1 2; do test "$(cat "$W/rc_$r")" = 3 || { echo "rank $r exited $(cat "$W/rc_$r"), expected 3"; exit 1; }; done
    grep -q "peer rank 3 (role env0) failed" "$W/err.txt"
    done_steps=$(sed -n 's/.*steps up to \([0-9]*\) are saved in checkpoints.*/\1/p' "$W/err.txt")
    test -n "$done_steps"
    $CHECK steps "$W/run" "$done_steps"
    test "$(basename "$(readlink "$W/run/checkpoints/latest")")" = "step_$done_steps"
    ;;
  restart_fewer_ranks)  # run.restart_remaining_ranks: learner rank 1 of 2 is SIGKILLed after a
    # checkpoint; the supervisor reads mpirun's report of the dead rank, logs it, and starts the job
    # again from the latest checkpoint without it (-np {np} = 3, cluster.learners 1): every step's
    # row exactly once. Without {np} in the launcher the key is refused.
    printf '"$@" &\necho $! > "$RANKDIR/pid_$OMPI_COMM_WORLD_RANK"\nwait $!\n' > "$W/rank.sh"
    export RANKDIR="$W"
    M="$MPIEXEC --oversubscribe --allow-run-as-root -x RANKDIR -np {np} --mca btl self,tcp --mca btl_tcp_if_include lo \
       --mca oob_tcp_if_include lo bash $W/rank.sh"
    "$TROUPE" run "$SRC/configs/multinode.yaml" --restarts 1 --launcher "$M" --set run.restart_remaining_ranks=true \
      --set run.dir="$W/run" --set sft.max_steps=4 --set grpo.max_steps=40 --set eval.every=0 --set eval.num_prompts=10 \
      --set checkpointing.every=2 --set cluster.peer_timeout_s=5 $Q 2> "$W/err.txt" &
    job=$!
    for i in $(seq 1 240); do
      [ -e "$W/run/checkpoints/latest" ] && [ -s "$W/pid_1" ] && break
      sleep 0.25
    done
    test -e "$W/run/checkpoints/latest"
    kill -9 "$(cat "$W/pid_1")"
    wait $job || { echo "the supervised run exited $?"; grep -v PMIX "$W/err.txt" | tail -20; exit 1; }
    grep "troupe: restart" "$W/err.txt"
    grep -q "restart 1 of 1: the job failed (it exited with code 137: a rank was killed by signal 9 (Killed)); lost rank 1, left out: learner1; 3 ranks (cluster.learners 1, generators 1, env_workers 1, scorers 0)" \
      "$W/run/logs/restarts.log" || { cat "$W/run/logs/restarts.log"; exit 1; }
    grep -q "troupe: 3 ranks: 0 learner0" "$W/err.txt" || { grep "ranks:" "$W/err.txt"; echo "not restarted on 3 ranks"; exit 1; }
    $CHECK steps "$W/run" 44
    expect_exit 2 "$TROUPE" run "$SRC/configs/quickstart.yaml" --restarts 1 --launcher "$MPIEXEC -np 3" \
      --set run.restart_remaining_ranks=true --set run.dir="$W/bad"
    grep -q "run.restart_remaining_ranks: the launcher ($MPIEXEC -np 3) has no {np}" "$W/err.txt"
    ;;
  generator_death)  # one of two generator ranks is SIGKILLed mid-GRPO: its prompts go to the other,
    # the run finishes (exit 0 on every survivor), and, the same requests being sent again with the
    # same seeds, its metrics equal a run where nothing died (nothing lost or trained twice)
    rank_wrapper
    G="--set sft.max_steps=5 --set grpo.max_steps=25 --set eval.every=0 --set eval.num_prompts=10
       --set checkpointing.every=0 --set cluster.generators=2 --set cluster.heartbeat_s=0.2 --set cluster.peer_timeout_s=2 $Q"
    MPI="--oversubscribe --allow-run-as-root --enable-recovery -x RANKDIR -np 5 --mca btl self,tcp
         --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
    "$MPIEXEC" $MPI bash "$W/rank.sh" "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/ref" $G 2> "$W/ref_err.txt"
    rm -f "$W"/rc_* "$W"/pid_*
    "$MPIEXEC" $MPI bash "$W/rank.sh" "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/run" $G 2> "$W/err.txt" &
    job=$!
    for i in $(seq 1 240); do
      [ "$(cat "$W/run/metrics.jsonl" 2> /dev/null | grep -c '"phase":"grpo"')" -ge 3 ] && [ -s "$W/pid_3" ] && break
      sleep 0.25
    done
    kill -9 "$(cat "$W/pid_3")"  # rank 3 is generator1 (learner0, learner1, generator0, generator1, env0)
    wait $job || true
    grep -v PMIX "$W/err.txt" | grep -v "grpo step" | tail -6
    grep -q "peer rank 3 (role generator1) failed.*the job goes on without it" "$W/err.txt"
    grep -q "generator 1 is down" "$W/err.txt"
    for r in 0 1 2 4; do test "$(cat "$W/rc_$r")" = 0 || { echo "rank $r exited $(cat "$W/rc_$r"), expected 0"; exit 1; }; done
    $CHECK steps "$W/run" 30
    $CHECK same "$W/ref" "$W/run"
    ;;
  placement_mismatch)  # -np 2 for a 4-role cluster section: exit 2 naming the file and the counts
    expect_exit nonzero "$MPIEXEC" --oversubscribe --allow-run-as-root -np 2 --mca btl self,tcp \
      --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "$TROUPE" run "$SRC/configs/multinode.yaml" \
      --set run.dir="$W/run"
    cat "$W/err.txt"
    grep -q "multinode.yaml:.*error: cluster: the job has 2 ranks but the cluster section places 4 roles" "$W/err.txt"
    # two learners in one process (no mpirun): refused before anything starts, naming the line
    expect_exit 2 "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/single"
    cat "$W/err.txt"
    grep -q "multinode.yaml:[0-9]*:[0-9]*: error: cluster.learners: 2 data-parallel learners need one rank each: run under mpirun -np 4" "$W/err.txt"
    test ! -e "$W/single"
    ;;
  srun)  # the multinode config under srun on a SLURM started here (tests/e2e/slurm_session.sh); 77 = skipped
    start_slurm e2e.srun
    S="timeout 150 srun --mpi=pmix --kill-on-bad-exit=1"
    $S -n 4 "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/run" \
      --set sft.max_steps=5 --set grpo.max_steps=3 --set eval.num_prompts=10 $Q
    $CHECK files "$W/run"
    expect_exit nonzero $S -n 2 "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/mismatch"
    cat "$W/err.txt"
    grep -q "multinode.yaml:.*error: cluster: the job has 2 ranks but the cluster section places 4 roles.*srun --mpi=pmix -n 4" "$W/err.txt"
    expect_exit nonzero timeout 60 srun --mpi=none -n 4 "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/none"
    cat "$W/err.txt"
    grep -q "error: srun started 4 tasks without an MPI plugin.*srun --mpi=pmix -n 4" "$W/err.txt"
    test ! -e "$W/mismatch"
    test ! -e "$W/none"
    ;;
  restart_srun)  # troupe run --restarts 1 --launcher "srun ..." on a SLURM started here: learner rank 1 is
    # SIGKILLed after a checkpoint; srun ends the job step, the supervisor (outside srun) restarts it
    # with --resume from the latest checkpoint, which finishes: every step's row exactly once; 77 = skipped
    start_slurm e2e.restart_srun
    rank_wrapper
    "$TROUPE" run "$SRC/configs/multinode.yaml" --restarts 1 \
      --launcher "timeout 200 srun --mpi=pmix --kill-on-bad-exit=1 -n 4 bash $W/rank.sh" --set run.dir="$W/run" \
      --set sft.max_steps=4 --set grpo.max_steps=40 --set eval.every=0 --set eval.num_prompts=10 \
      --set checkpointing.every=2 --set cluster.peer_timeout_s=5 $Q 2> "$W/err.txt" &
    restarted_once $!
    ;;
  dynamic_sampling)  # DAPO: filtered groups are refilled by more generation rounds (bounded); resume is bit-identical
    S="--set grpo.dynamic_sampling=true --set grpo.max_generation_rounds=6 --set rollout.prompts_per_step=4 --set sft.max_steps=20 --set optimizer.schedule=constant --set eval.every=0 --set eval.num_prompts=10 --set checkpointing.every=2 $Q"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/a" --set grpo.max_steps=4 $S
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/b" --set grpo.max_steps=2 $S
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/b" --set grpo.max_steps=4 $S
    $CHECK same "$W/a" "$W/b"
    $CHECK dynamic "$W/a" 4 6
    # async: steps that keep no group train on nothing; the rollout thread must not wait for their version
    timeout 120 "$TROUPE" run "$SRC/configs/async.yaml" --set run.dir="$W/async" --set sft.max_steps=20 --set grpo.max_steps=6 \
      --set grpo.dynamic_sampling=true --set grpo.max_generation_rounds=2 --set rollout.prompts_per_step=4 \
      --set rollout.async_chunks=1 --set eval.num_prompts=10 $Q
    $CHECK staleness "$W/async" 1
    ;;
  dataset_relative)  # the dataset env's relative JSONL paths start at the YAML file's folder, not the cwd
    mkdir -p "$W/cfg/data" "$W/elsewhere"
    cp "$SRC/configs/quickstart.yaml" "$W/cfg/exp.yaml"
    for i in 1 2 3 4 5 6 7 8; do echo "{\"question\": \"$i+1=\", \"answer\": \"$((i + 1))\"}"; done > "$W/cfg/data/train.jsonl"
    echo '{"question": "9+1=", "answer": "10"}' > "$W/cfg/data/eval.jsonl"
    cd "$W/elsewhere"
    "$TROUPE" run ../cfg/exp.yaml --set run.dir="$W/run" --set envs[0].name=dataset \
      --set "envs[0].config={train: data/train.jsonl, eval: data/eval.jsonl, verifier: numeric}" \
      --set sft.max_steps=2 --set grpo.max_steps=2 --set eval.num_prompts=2 $Q
    $CHECK files "$W/run"
    grep -q '"reward_mean/dataset"' "$W/run/metrics.jsonl"
    ;;
  dataset_gsm8k)  # raw GSM8K rows: extract: gsm8k takes the reference after ####, verifier: math scores the
                  # response's final answer; a row whose reference has no #### stops the start naming FILE:LINE
    mkdir -p "$W/data"
    for i in 1 2 3 4 5 6 7 8; do
      echo "{\"question\": \"$i+$i=\", \"answer\": \"$i+$i=$((2 * i)).\\n#### $((2 * i))\"}"
    done > "$W/data/train.jsonl"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/run" --set envs[0].name=dataset \
      --set "envs[0].config={train: $W/data/train.jsonl, extract: gsm8k, verifier: math, eval_fraction: 0.25}" \
      --set rollout.max_response_length=12 --set sft.max_steps=2 --set grpo.max_steps=2 --set eval.num_prompts=2 $Q
    $CHECK files "$W/run"
    grep -q '"reward_mean/dataset"' "$W/run/metrics.jsonl"
    echo '{"question": "9+9=", "answer": "9+9=18"}' >> "$W/data/train.jsonl"
    expect_exit 2 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/bad" --set envs[0].name=dataset \
      --set "envs[0].config={train: $W/data/train.jsonl, extract: gsm8k, verifier: math}" $Q
    grep -q "train.jsonl:9: error: reference '9+9=18' has no '####'" "$W/err.txt" || { cat "$W/err.txt"; exit 1; }
    ;;
  multi_turn)  # guess_number: each turn continues the conversation with the env's feedback (training and eval)
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/run" --set envs[0].name=guess_number \
      --set "envs[0].config={max_number: 10, max_turns: 3}" --set rollout.max_turns=3 --set rollout.max_prompt_length=200 \
      --set policy.model.max_position_embeddings=256 --set sft.enabled=false --set grpo.max_steps=3 \
      --set rollout.prompts_per_step=4 --set eval.num_prompts=10 --set eval.at_start=true $Q
    $CHECK files "$W/run"
    $CHECK episodes "$W/run" 3  # eval plays whole greedy episodes; eval_accuracy = episodes solved
    # a scripted remote env solved on turn 2 whatever is said (first-turn verify scores 0): eval and
    # training must count every episode as solved
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/two" --set envs[0].name=two_turn \
      --set envs[0].type=remote --set "envs[0].command=[$PY, $SRC/tests/e2e/two_turn_env.py, --bind, '{bind}']" \
      --set "envs[0].config={}" --set rollout.max_turns=3 --set rollout.max_prompt_length=200 \
      --set policy.model.max_position_embeddings=256 --set sft.enabled=false --set grpo.max_steps=1 \
      --set rollout.prompts_per_step=2 --set eval.num_prompts=4 $Q
    grep -q '"eval_accuracy":1.0,.*"eval_reward_mean":0.5,.*"eval_turns_mean":2.0' "$W/two/metrics.jsonl"
    grep -q '"accuracy":1.0' "$W/two/metrics.jsonl"
    ;;
  chat_multi_turn)  # rollout.template chat on the Qwen3 template: the env's messages are the prompt,
    # its answers are the template's user and tool turns (check_chat_turns.py checks every turn's tokens)
    cp -r "$SRC/tests/hf_fixture/qwen3_moe" "$W/model"
    cp "$SRC/tests/chat_template/templates/Qwen-Qwen3-0.6B.jinja" "$W/model/chat_template.jinja"
    $PY -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['max_position_embeddings']=1024; json.dump(c, open(p,'w'))" \
      "$W/model/config.json"
    $PY -c "import re,sys; t=open(sys.argv[1]).read(); open(sys.argv[2],'w').write(re.sub(r'\n  model:\n(    .*\n)+', '\n', t))" \
      "$SRC/configs/quickstart.yaml" "$W/loaded.yaml"
    "$TROUPE" run "$W/loaded.yaml" --set run.dir="$W/run" --set policy.path="$W/model" --set policy.tokenizer=auto \
      --set envs[0].name=chat_turns --set envs[0].type=remote --set "envs[0].config={}" \
      --set "envs[0].command=[$PY, $SRC/tests/e2e/chat_turns_env.py, --bind, '{bind}']" \
      --set rollout.template=chat --set rollout.max_turns=3 --set rollout.max_prompt_length=1000 \
      --set rollout.max_response_length=6 --set sft.enabled=false --set grpo.max_steps=1 \
      --set rollout.prompts_per_step=2 --set eval.num_prompts=2 $Q
    $CHECK files "$W/run"
    $PY "$SRC/tests/e2e/check_chat_turns.py" "$TROUPE" "$W/model" "$W/run"
    grep -q '"eval_accuracy":1.0' "$W/run/metrics.jsonl"
    ;;
  from_model_dir)  # policy.path: a transformers-made directory (BPE tokenizer), then one of our checkpoints
    S="--set sft.max_steps=2 --set grpo.max_steps=2 --set eval.num_prompts=5 $Q"
    # the quickstart without its fresh-model architecture (policy.model), which a loaded model refuses
    $PY -c "import re,sys; t=open(sys.argv[1]).read(); open(sys.argv[2],'w').write(re.sub(r'\n  model:\n(    .*\n)+', '\n', t))" \
      "$SRC/configs/quickstart.yaml" "$W/loaded.yaml"
    expect_exit 2 "$TROUPE" validate "$SRC/configs/quickstart.yaml" --set policy.path="$SRC/tests/hf_fixture/qwen3_moe"
    grep -q "policy.model.family: policy.path is set, so the architecture comes from its config.json; remove the policy.model section" "$W/err.txt"
    "$TROUPE" run "$W/loaded.yaml" --set run.dir="$W/hf" --set policy.path="$SRC/tests/hf_fixture/qwen3_moe" \
      --set policy.tokenizer=auto --set policy.activation_checkpointing=true $S
    $CHECK files "$W/hf"
    "$TROUPE" run "$W/loaded.yaml" --set run.dir="$W/ours" --set policy.path="$W/hf/checkpoints/latest" $S
    $CHECK files "$W/ours"
    ;;
  env_faults)  # a plug-in env that crashes or hangs now and then: the run goes on (env_failures counts
    # the lost samples); one that crashes all the time fails the run, and the steps done are saved
    FAULTY="$(dirname "$TROUPE")/../lib/libfaulty_env.so"
    F="--set envs[0].type=plugin --set envs[0].path=$FAULTY --set sft.enabled=false --set grpo.max_steps=3"
    F="$F --set eval.every=0 --set eval.num_prompts=10 --set checkpointing.every=0 $Q"
    # failed calls are retried on a fresh worker (env_retries); env_failures counts those still failed after retries
    failures() { $PY -c "import json,sys; rs=[json.loads(l) for l in open(sys.argv[1]+'/metrics.jsonl')]; n=sum((r.get('env_failures') or 0) + (r.get('env_retries') or 0) for r in rs); print('env_failures + env_retries', n); sys.exit(0 if n > 0 else 1)" "$1"; }
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/crash" $F \
      --set 'envs[0].config={"fault": "segfault", "fault_every_verify": 100}'
    $CHECK steps "$W/crash" 3
    failures "$W/crash"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/hang" $F --set envs[0].timeout_s=1 \
      --set 'envs[0].config={"fault": "hang", "fault_every_verify": 150}'
    $CHECK steps "$W/hang" 3
    failures "$W/hang"
    # a run whose env keeps crashing must fail
    expect_exit nonzero "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/broken" $F --set grpo.max_steps=10 \
      --set 'envs[0].config={"fault": "segfault", "fault_every_verify": 7}'
    tail -3 "$W/err.txt"
    grep -q "gave up after .* env worker restarts" "$W/err.txt"
    grep -q "Segmentation fault" "$W/err.txt"
    done_steps=$(sed -n 's/.*steps up to \([0-9]*\) are saved in checkpoints.*/\1/p' "$W/err.txt")
    test -n "$done_steps"
    $CHECK steps "$W/broken" "$done_steps"
    test "$(basename "$(readlink "$W/broken/checkpoints/latest")")" = "step_$done_steps"
    ;;
  bad_input)  # bad env name / missing plug-in / bad --resume: clear errors, exit 2, nothing written
    for args in "--set envs[0].name=nope" "--set envs[0].type=plugin --set envs[0].path=/no/such.so" "--resume $W/none"; do
      expect_exit 2 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/run" $args
      cat "$W/err.txt"
      grep -q "error" "$W/err.txt"
    done
    grep -q "nope" "$W/err.txt" || true
    ;;
  weight_sync)  # delta weight sync (the default) trains bit for bit as full syncs do, sync and async; bf16 generators
    # pass the probe on every sync; full_every 4 mixes full syncs into the deltas
    S="--set sft.max_steps=8 --set grpo.max_steps=8 --set eval.every=0 --set eval.num_prompts=20 --set checkpointing.enabled=false $Q"
    for cfg in quickstart async; do
      "$TROUPE" run "$SRC/configs/$cfg.yaml" --set run.dir="$W/${cfg}_delta" --set weight_sync.full_every=4 $S
      "$TROUPE" run "$SRC/configs/$cfg.yaml" --set run.dir="$W/${cfg}_full" --set weight_sync.mode=full $S
      $CHECK same "$W/${cfg}_delta" "$W/${cfg}_full"
      "$TROUPE" run "$SRC/configs/$cfg.yaml" --set run.dir="$W/${cfg}_bf16" --set weight_sync.dtype=bf16 $S
      $CHECK steps "$W/${cfg}_bf16" 16
    done
    # exact on-policy sampling keeps fp32 generators: bf16 with batch_invariant is a config error
    expect_exit 2 "$TROUPE" validate "$SRC/configs/quickstart.yaml" --set weight_sync.dtype=bf16 --set policy.batch_invariant=true
    grep -q "weight_sync.dtype" "$W/err.txt"
    ;;
  device_path)  # policy.device cpu_fenced (the device path a GPU takes: host mirror of the weights, every op
    # on device memory the host cannot touch, AdamW on the device) trains bit for bit as cpu does: sync, async,
    # the optimizer offloaded to the host, bf16 generators, offload
    S="--set sft.max_steps=8 --set grpo.max_steps=6 --set eval.every=3 --set eval.num_prompts=20 --set checkpointing.enabled=false $Q"
    for cfg in quickstart async; do
      "$TROUPE" run "$SRC/configs/$cfg.yaml" --set run.dir="$W/${cfg}_cpu" $S
      "$TROUPE" run "$SRC/configs/$cfg.yaml" --set run.dir="$W/${cfg}_fenced" --set policy.device=cpu_fenced $S
      $CHECK same "$W/${cfg}_cpu" "$W/${cfg}_fenced"
    done
    # the optimizer on the host mirror (learner.optimizer_offload) equals the device optimizer above
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/offload_opt_fenced" --set policy.device=cpu_fenced \
      --set learner.optimizer_offload=true $S
    $CHECK same "$W/quickstart_cpu" "$W/offload_opt_fenced"
    # bf16 generators: learner 0's probe swaps the rounded copy in and the master back (on a device
    # backend the master must reach the device again)
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/bf16_cpu" --set weight_sync.dtype=bf16 $S
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/bf16_fenced" --set weight_sync.dtype=bf16 \
      --set policy.device=cpu_fenced $S
    $CHECK same "$W/bf16_cpu" "$W/bf16_fenced"
    # activation offload through the device backend's own copies: the same numbers too
    O="--set policy.activation_checkpointing=true --set policy.offload_activations=true"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/offload_cpu" $O $S
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/offload_fenced" --set policy.device=cpu_fenced $O $S
    $CHECK same "$W/offload_cpu" "$W/offload_fenced"
    $CHECK same "$W/quickstart_cpu" "$W/offload_fenced"
    # weight_sync.transport nccl: the values by broadcast over the weight group (in-process on
    # cpu_fenced), sync and async, fp32 and bf16 generators: the same numbers as over ZeroMQ
    B="--set policy.device=cpu_fenced --set weight_sync.transport=nccl"
    for cfg in quickstart async; do
      "$TROUPE" run "$SRC/configs/$cfg.yaml" --set run.dir="$W/${cfg}_bcast" $B $S 2>&1 | tee "$W/${cfg}_bcast.log"
      grep -q "joined the weight group (in-process)" "$W/${cfg}_bcast.log"
      $CHECK same "$W/${cfg}_cpu" "$W/${cfg}_bcast"
    done
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/bf16_bcast" --set weight_sync.dtype=bf16 $B $S
    $CHECK same "$W/bf16_cpu" "$W/bf16_bcast"
    # two generators taking in-flight updates (each broadcast is staged, then taken between decode steps)
    F="--set rollout.in_flight_updates=true --set rollout.async_chunks=1 --set cluster.generators=2"
    "$TROUPE" run "$SRC/configs/async.yaml" --set run.dir="$W/inflight_zmq" $F $S
    "$TROUPE" run "$SRC/configs/async.yaml" --set run.dir="$W/inflight_bcast" $F $B $S
    $CHECK same "$W/inflight_zmq" "$W/inflight_bcast"
    ;;
  weight_sync_ranks)  # the same across ranks (tcp): delta == full bit for bit, bf16 probes pass on a generator rank
    M="$MPIEXEC --oversubscribe --allow-run-as-root -np 4 --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
    S="--set sft.max_steps=4 --set grpo.max_steps=4 --set eval.num_prompts=10 --set checkpointing.enabled=false $Q"
    $M "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/delta" --set weight_sync.full_every=3 $S
    $M "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/full" --set weight_sync.mode=full $S
    $CHECK same "$W/delta" "$W/full"
    $M "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/bf16" --set weight_sync.dtype=bf16 $S
    $CHECK steps "$W/bf16" 8
    # weights by broadcast on cpu_fenced: its weight group is in-process, so generators on other
    # ranks are an error naming the generator, before any step
    expect_exit nonzero $M "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/bcast" \
      --set policy.device=cpu_fenced --set weight_sync.transport=nccl $S
    grep -q "so the weight group is in-process, but generator 0 (node" "$W/err.txt" || { cat "$W/err.txt"; exit 1; }
    ;;
  distill)  # on-policy distillation: a fresh quickstart student learns from the quickstart after SFT
    # (the teacher, served by a scorer): the reverse KL falls; same seed and --resume bit for bit;
    # top-k + the reward's advantage on two scorers; a teacher with another tokenizer is refused
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/teacher" --set grpo.enabled=false \
      --set sft.max_steps=60 --set eval.every=0 --set eval.num_prompts=20 $Q
    T=$(readlink -f "$W/teacher/checkpoints/latest")
    D="--set sft.enabled=false --set distill.teacher=$T --set cluster.scorers=1 --set optimizer.lr=0.003
       --set optimizer.schedule=constant --set rollout.prompts_per_step=16 --set eval.every=0
       --set eval.num_prompts=20 --set checkpointing.every=4 $Q"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/a" --set grpo.max_steps=12 $D
    $CHECK distilled "$W/a"
    grep -q '"scorer/batch_requests"' "$W/a/metrics.jsonl"
    grep -q '"scorer/latency_max_s"' "$W/a/metrics.jsonl"
    "$TROUPE" report "$W/a" > /dev/null  # with the frozen models' panel (distill/*, scorer/latency_s)
    test -s "$W/a/report.png"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/b" --set grpo.max_steps=4 $D
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/b" --set grpo.max_steps=12 $D
    $CHECK same "$W/a" "$W/b"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/c" --set grpo.max_steps=2 $D \
      --set distill.topk=4 --set distill.reward_coef=0.5 --set cluster.scorers=2
    grep -q '"distill/topk_kl"' "$W/c/metrics.jsonl"
    expect_exit 2 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/d" --set grpo.max_steps=1 $D \
      --set policy.tokenizer=byte --set policy.model.vocab_size=300
    grep -q "another tokenizer" "$W/err.txt"
    grep -q "teacher tokenizer xxh3:" "$W/err.txt"
    expect_exit 2 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/e" $D --set cluster.scorers=0
    grep -q "distill.teacher: the teacher is served by the scorers" "$W/err.txt"
    ;;
  distill_scorer_death)  # distillation with the teacher on two scorer ranks (mpirun -np 5: learner0,
    # generator0, env0, scorer0, scorer1); scorer1 is SIGKILLed mid-GRPO: its teacher requests are
    # retried on scorer0 and counted (scorer/failures, scorer/retries), the run finishes (exit 0 on
    # every survivor), and every other metric equals a run where nothing died (the same teacher numbers)
    rank_wrapper
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/teacher" --set grpo.enabled=false \
      --set sft.max_steps=20 --set eval.every=0 --set eval.num_prompts=20 --set checkpointing.every=0 $Q
    T=$(readlink -f "$W/teacher/checkpoints/latest")
    D="--set sft.enabled=false --set grpo.max_steps=12 --set distill.teacher=$T --set distill.timeout_s=5
       --set eval.every=0 --set eval.num_prompts=10 --set checkpointing.every=0 --set cluster.learners=1
       --set cluster.scorers=2 --set cluster.heartbeat_s=0.2 --set cluster.peer_timeout_s=2 $Q"
    MPI="--oversubscribe --allow-run-as-root --enable-recovery -x RANKDIR -np 5 --mca btl self,tcp
         --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
    "$MPIEXEC" $MPI bash "$W/rank.sh" "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/ref" $D 2> "$W/ref_err.txt"
    rm -f "$W"/rc_* "$W"/pid_*
    "$MPIEXEC" $MPI bash "$W/rank.sh" "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/run" $D 2> "$W/err.txt" &
    job=$!
    for i in $(seq 1 240); do
      [ "$(cat "$W/run/metrics.jsonl" 2> /dev/null | grep -c '"phase":"grpo"')" -ge 3 ] && [ -s "$W/pid_4" ] && break
      sleep 0.25
    done
    kill -9 "$(cat "$W/pid_4")"  # rank 4 is scorer1
    wait $job || true
    grep -v PMIX "$W/err.txt" | grep -v "grpo step" | tail -6
    grep -q "peer rank 4 (role scorer1) failed.*the job goes on without it" "$W/err.txt"
    for r in 0 1 2 3; do test "$(cat "$W/rc_$r")" = 0 || { echo "rank $r exited $(cat "$W/rc_$r"), expected 0"; exit 1; }; done
    $CHECK steps "$W/run" 12
    $PY - "$W/ref" "$W/run" << 'PYEOF'
import json, os, sys
def grpo(run):
    rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
    return [r for r in rows if r.get("phase") == "grpo" and "reward_mean" in r]
ref, run = grpo(sys.argv[1]), grpo(sys.argv[2])
assert len(ref) == len(run) == 12, (len(ref), len(run))
assert all(r["scorer/failures"] == 0 for r in ref), [r["scorer/failures"] for r in ref]
failures, retries = sum(r["scorer/failures"] for r in run), sum(r["scorer/retries"] for r in run)
assert failures >= 1 and retries >= 1, (failures, retries)
for x, y in zip(ref, run):  # what the teacher said is the same: every other non-timing value too
    assert x["scorer/requests"] == y["scorer/requests"], (x["step"], x["scorer/requests"], y["scorer/requests"])
    for k in x:
        if k.endswith(("_s", "batch_requests", "batch_requests_max")) or k in ("tokens_per_s", "scorer/failures", "scorer/retries"):
            continue
        assert x[k] == y.get(k), (x["step"], k, x[k], y.get(k))
print("distill_scorer_death: %d teacher requests failed and were retried on scorer0; the rest identical" % failures)
PYEOF
    ;;
  smollm2_distill)  # configs/smollm2_distill.yaml for 2 short steps: the real SmolLM2 student (the GGUF) with
    # a tiny teacher sharing its tokenizer (make_tiny_teacher.py) on one scorer; distill metrics logged
    GGUF=$(bash "$SRC/tests/gguf/fetch_smollm2.sh" "$PY") || { echo "SKIP: no SmolLM2 GGUF"; exit 77; }
    "$TROUPE" score "$GGUF" --tokens 1,2 > /dev/null  # the GGUF's import (config + tokenizer files)
    IMPORT=$(ls -d "${TROUPE_CACHE:-$HOME/.cache/troupe}"/gguf/SmolLM2-135M-Instruct.Q4_1-* | head -n 1)
    "$PY" "$SRC/tests/e2e/make_tiny_teacher.py" "$IMPORT" "$W/teacher" > /dev/null
    "$TROUPE" run "$SRC/configs/smollm2_distill.yaml" --set run.dir="$W/run" --set distill.teacher="$W/teacher" \
      --set grpo.max_steps=2 --set rollout.prompts_per_step=2 --set rollout.num_generations=2 \
      --set rollout.max_response_length=8 --set eval.at_start=false --set eval.every=0 --set eval.num_prompts=4 \
      --set checkpointing.enabled=false --set logger.tensorboard=false --set policy.path="$GGUF" $Q
    $PY - "$W/run" << 'PYEOF'
import json, os, sys
rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], "metrics.jsonl")) if l.strip()]
grpo = [r for r in rows if r.get("phase") == "grpo" and "reward_mean" in r]
assert len(grpo) == 2, grpo
for r in grpo:
    for k in ("distill/reverse_kl", "distill/teacher_logprob_mean", "scorer/requests"):
        assert k in r, (r["step"], k, sorted(r))
    assert r["scorer/requests"] >= 1 and r["scorer/failures"] == 0, r
print("smollm2_distill: ok", [round(r["distill/reverse_kl"], 4) for r in grpo])
PYEOF
    ;;
  qlora)  # QLoRA: the quickstart's attention projections as a q8_0 base under LoRA adapters; same seed
    # and --resume bit for bit; bad policy.base_dtype settings are FILE:LINE errors naming the key
    printf '  base_dtype: q8_0\n  lora:\n    rank: 8\n    alpha: 16\n    targets: [q, k, v, o]\n    lr: 0.002\n' \
      > "$W/qlora_keys.txt"
    sed "/^  tokenizer: char/r $W/qlora_keys.txt" "$SRC/configs/quickstart.yaml" > "$W/qlora.yaml"
    S="--set sft.enabled=false --set eval.every=0 --set optimizer.schedule=constant --set checkpointing.every=3 $Q"
    "$TROUPE" run "$W/qlora.yaml" --set run.dir="$W/a" --set grpo.max_steps=6 $S
    "$TROUPE" run "$W/qlora.yaml" --set run.dir="$W/b" --set grpo.max_steps=3 $S
    "$TROUPE" run "$W/qlora.yaml" --resume "$W/b" --set grpo.max_steps=6 $S
    $CHECK same "$W/a" "$W/b"
    ck=$(readlink -f "$W/a/checkpoints/latest")
    test -s "$ck/adapter_model.safetensors" && test ! -e "$ck/model.safetensors"
    expect_exit 2 "$TROUPE" validate "$W/qlora.yaml" --set policy.lora.rank=0
    grep -q "qlora.yaml:[0-9]*:[0-9]*: error: policy.base_dtype: q8_0 holds a frozen, quantized base, but policy.lora.rank is 0" "$W/err.txt"
    expect_exit 2 "$TROUPE" validate "$W/qlora.yaml" --set policy.base_dtype=q3_x
    grep -q "policy.base_dtype" "$W/err.txt"
    expect_exit 2 "$TROUPE" validate "$W/qlora.yaml" --set policy.base_dtype=gguf
    grep -q "error: policy.base_dtype: gguf keeps the blocks of a .gguf policy.path, but policy.path is empty" "$W/err.txt"
    expect_exit 2 "$TROUPE" validate "$W/qlora.yaml" --set policy.base_dtype=q4_k
    grep -q "error: policy.base_dtype: q4_k blocks hold 256 values of a weight row, but policy.model.hidden_size is 64" "$W/err.txt"
    ;;
  lora)  # LoRA adapters (attention) on an SFT-trained quickstart base: GRPO learns; checkpoints hold the
    # adapters alone; --resume, delta vs full sync, cpu_fenced: bit for bit; exact on-policy with
    # batch_invariant; dropout resumes bit for bit; adapters on the routed experts; bad policy.lora
    # keys are FILE:LINE errors
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/base" --set grpo.enabled=false \
      --set eval.every=0 --set eval.num_prompts=200 $Q
    base=$(readlink -f "$W/base/checkpoints/latest")
    # the quickstart without policy.model (policy.path's config.json is the architecture), with adapters
    sed '/^  model:/,/^    max_position_embeddings/d' "$SRC/configs/quickstart.yaml" > "$W/lora.yaml"
    printf '  path: %s\n  lora:\n    rank: 8\n    alpha: 16\n    targets: [q, k, v, o]\n    lr: 0.002\n' "$base" \
      > "$W/lora_keys.txt"
    sed -i "/^  tokenizer: char/r $W/lora_keys.txt" "$W/lora.yaml"
    L="--set sft.enabled=false --set eval.every=0 --set eval.num_prompts=200 $Q"
    "$TROUPE" run "$W/lora.yaml" --set run.dir="$W/learn" --set grpo.max_steps=100 $L
    $CHECK learned "$W/learn"
    $CHECK improved "$W/base" "$W/learn"
    # the checkpoint holds the adapters alone, in PEFT's layout, and base.json names the base (policy.path)
    ck=$(readlink -f "$W/learn/checkpoints/latest")
    a=$(stat -c %s "$ck/adapter_model.safetensors") b=$(stat -c %s "$base/model.safetensors")
    echo "adapter checkpoint $a bytes, base $b bytes"
    test $((a * 8)) -lt "$b"
    test ! -e "$ck/model.safetensors"
    grep -q '"peft_type": "LORA"' "$ck/adapter_config.json"
    grep -q "\"path\": \"$base\"" "$ck/base.json"
    "$TROUPE" eval "$W/lora.yaml" --checkpoint "$ck" --set eval.num_prompts=20 > "$W/eval.json"
    $CHECK eval_json "$W/eval.json"
    # merged into its base: a plain model directory that troupe (and transformers) load
    "$TROUPE" export "$ck" "$W/merged" --merge
    test -s "$W/merged/config.json" && test -s "$W/merged/model.safetensors"
    "$TROUPE" eval "$W/lora.yaml" --checkpoint "$W/merged" --set policy.lora.rank=0 --set eval.num_prompts=20 > "$W/eval_merged.json"
    $CHECK eval_json "$W/eval_merged.json"
    # an adapter trained with other settings is refused naming the file and key
    expect_exit nonzero "$TROUPE" eval "$W/lora.yaml" --checkpoint "$ck" --set policy.lora.rank=4
    grep -q "adapter_config.json: key 'r' is 8" "$W/err.txt"
    S="--set optimizer.schedule=constant --set checkpointing.every=4 $L"
    "$TROUPE" run "$W/lora.yaml" --set run.dir="$W/a" --set grpo.max_steps=8 $S
    "$TROUPE" run "$W/lora.yaml" --set run.dir="$W/b" --set grpo.max_steps=4 $S
    "$TROUPE" run "$W/lora.yaml" --resume "$W/b" --set grpo.max_steps=8 $S
    $CHECK same "$W/a" "$W/b"
    "$TROUPE" run "$W/lora.yaml" --set run.dir="$W/full" --set grpo.max_steps=8 --set weight_sync.mode=full $S
    $CHECK same "$W/a" "$W/full"
    "$TROUPE" run "$W/lora.yaml" --set run.dir="$W/fenced" --set grpo.max_steps=8 --set policy.device=cpu_fenced $S
    $CHECK same "$W/a" "$W/fenced"
    "$TROUPE" run "$W/lora.yaml" --set run.dir="$W/exact" --set grpo.max_steps=4 --set policy.batch_invariant=true $L
    $CHECK mismatch "$W/exact" 4 exact
    # dropout: --resume continues bit for bit (the masks follow the optimizer step)
    D="--set policy.lora.dropout=0.1 $S"
    "$TROUPE" run "$W/lora.yaml" --set run.dir="$W/da" --set grpo.max_steps=8 $D
    "$TROUPE" run "$W/lora.yaml" --set run.dir="$W/db" --set grpo.max_steps=4 $D
    "$TROUPE" run "$W/lora.yaml" --resume "$W/db" --set grpo.max_steps=8 $D
    $CHECK same "$W/da" "$W/db"
    # adapters on every linear layer of the MoE base, routed experts included: cpu_fenced bit for bit
    X="--set policy.lora.targets=all_linear --set grpo.max_steps=4 $S"
    "$TROUPE" run "$W/lora.yaml" --set run.dir="$W/xa" $X
    "$TROUPE" run "$W/lora.yaml" --set run.dir="$W/xf" --set policy.device=cpu_fenced $X
    $CHECK same "$W/xa" "$W/xf"
    grep -q 'mlp.experts.0.gate_proj' "$(readlink -f "$W/xa/checkpoints/latest")/adapter_config.json"
    # bad input: dropout on the experts' adapters, a rank above a layer's width, a kind with no module
    expect_exit 2 "$TROUPE" validate "$W/lora.yaml" --set policy.lora.targets=experts --set policy.lora.dropout=0.1
    grep -q "error: policy.lora.dropout: 0.1" "$W/err.txt"
    expect_exit 2 "$TROUPE" validate "$W/lora.yaml" --set policy.lora.rank=40
    grep -q "error: policy.lora.rank: 40 exceeds min(in, out) = 32 of model.layers.0.self_attn.k_proj" "$W/err.txt"
    expect_exit 2 "$TROUPE" validate "$W/lora.yaml" --set policy.lora.targets=gate
    grep -q "error: policy.lora.targets: gate matches no module" "$W/err.txt"
    expect_exit 2 "$TROUPE" validate "$W/lora.yaml" --set policy.lora.rank=-2
    grep -q "policy.lora.rank" "$W/err.txt"
    expect_exit 2 "$TROUPE" validate "$W/lora.yaml" --set policy.lora.alpha=-1
    grep -q "policy.lora.alpha" "$W/err.txt"
    expect_exit 2 "$TROUPE" validate "$W/lora.yaml" --set policy.lora.dropout=-0.1
    grep -q "policy.lora.dropout" "$W/err.txt"
    expect_exit 2 "$TROUPE" validate "$W/lora.yaml" --set policy.lora.targets=qq
    grep -q "'qq' is not one of: q, k, v, o, gate, up, down, experts, all_linear" "$W/err.txt"
    ;;
  mismatch_metrics)  # sampler vs learner log-probs and MoE routing on every GRPO step: sync, async, corrections
    S="--set sft.max_steps=10 --set grpo.max_steps=6 --set eval.every=0 --set eval.num_prompts=20 --set checkpointing.enabled=false $Q"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/sync" $S
    $CHECK mismatch "$W/sync" 6
    # async with stale samples: each scored with the weights of the version that sampled it
    "$TROUPE" run "$SRC/configs/async.yaml" --set run.dir="$W/async" $S
    $CHECK mismatch "$W/async" 6
    for k in tis mis seq_geo_mask icepop; do
      "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/$k" --set loss.mismatch_correction=$k $S
      $CHECK mismatch "$W/$k" 6
    done
    # routing replay: every recorded (token, MoE layer) routes as the sampler did, sync and async
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/replay" --set policy.moe.routing_replay=rollout $S
    $CHECK mismatch "$W/replay" 6 routes
    "$TROUPE" run "$SRC/configs/async.yaml" --set run.dir="$W/replay_async" --set policy.moe.routing_replay=rollout $S
    $CHECK mismatch "$W/replay_async" 6 routes
    # batch invariance: sampler and learner agree exactly on every step, sync and async
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/invariant" --set policy.batch_invariant=true $S
    $CHECK mismatch "$W/invariant" 6 exact
    "$TROUPE" run "$SRC/configs/async.yaml" --set run.dir="$W/invariant_async" --set policy.batch_invariant=true $S
    $CHECK mismatch "$W/invariant_async" 6 exact
    # replay on a dense model: a FILE:LINE error, exit 2
    sed 's/^    num_experts: 4/    num_experts: 0/' "$SRC/configs/quickstart.yaml" > "$W/dense_replay.yaml"
    printf '  moe:\n    routing_replay: rollout\n' > "$W/moe_key.txt"
    sed -i "/^  tokenizer: char/r $W/moe_key.txt" "$W/dense_replay.yaml"
    expect_exit 2 "$TROUPE" validate "$W/dense_replay.yaml"
    cat "$W/err.txt"
    grep -q "dense_replay.yaml:[0-9]*:[0-9]*: error: policy.moe.routing_replay" "$W/err.txt"
    # a correction bound out of range, and a lower bound above its upper one: FILE:LINE errors, exit 2
    sed 's/^  agg_mode: token-mean/  agg_mode: token-mean\n  mismatch_correction: mis\n  mis_low: -0.5/' \
      "$SRC/configs/quickstart.yaml" > "$W/bad_low.yaml"
    expect_exit 2 "$TROUPE" validate "$W/bad_low.yaml"
    cat "$W/err.txt"
    grep -q "bad_low.yaml:[0-9]*:[0-9]*: error: loss.mis_low" "$W/err.txt"
    sed 's/^  agg_mode: token-mean/  agg_mode: token-mean\n  icepop_low: 3\n  icepop_high: 2/' \
      "$SRC/configs/quickstart.yaml" > "$W/bad_order.yaml"
    expect_exit 2 "$TROUPE" validate "$W/bad_order.yaml"
    cat "$W/err.txt"
    grep -q "bad_order.yaml:[0-9]*:[0-9]*: error: loss.icepop_high" "$W/err.txt"
    ;;
  rank_change_resume)  # a checkpoint of N learners / M generators resumes with other counts (mpirun)
    # Batch-invariant kernels and per-sample RNG streams: a sample's tokens do not depend on which
    # generator, in how big a batch, sampled it. Constant lr: the cosine schedule depends on max_steps.
    # (SFT long enough that GRPO groups get distinct rewards, so every GRPO step updates the weights)
    S="--set optimizer.schedule=constant --set sft.max_steps=39 --set eval.every=0 --set eval.num_prompts=10 \
       --set checkpointing.every=3 --set policy.batch_invariant=true --set rollout.prompts_per_step=16 \
       --set cluster.transport=ipc $Q"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/a" --set grpo.max_steps=6 $S
    # 1 -> 2 generators (ranks: learner, generator, generator, env): bit for bit the uninterrupted run
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/g" --set grpo.max_steps=3 $S
    $MPI -np 4 "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/g" --set grpo.max_steps=6 \
      --set cluster.generators=2 $S
    "$PY" - "$W/a/metrics.jsonl" << 'EOS'
import json, sys
g = [r for r in map(json.loads, open(sys.argv[1])) if r["phase"] == "grpo" and "eval_accuracy" not in r]
assert len(g) == 6 and all(r["grad_norm"] > 0 for r in g) and any(r["reward_mean"] > 0 for r in g), g
print("grpo rows update the weights: grad_norm", [round(r["grad_norm"], 4) for r in g])
EOS
    $CHECK same "$W/a" "$W/g"
    # an uninterrupted run on 2 generators is the same run too
    $MPI -np 4 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/g2" --set grpo.max_steps=6 \
      --set cluster.generators=2 $S
    $CHECK same "$W/a" "$W/g2"
    # 1 -> 2 learners: the same state resumed (steps before the checkpoint identical, same data
    # cursor after); the 2-rank all-reduce sums the gradient in another order, so the updates
    # after it agree to rounding, not bit for bit
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/l12" --set grpo.max_steps=3 $S
    $MPI -np 4 "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/l12" --set grpo.max_steps=6 \
      --set cluster.learners=2 $S
    $CHECK close "$W/a" "$W/l12" 43 1e-3
    # 2 -> 1 learners: the 2-learner run's own checkpoint, resumed by one learner, goes on as the
    # uninterrupted 2-learner run does up to the rounding of the all-reduce
    $MPI -np 4 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/l2" --set grpo.max_steps=6 \
      --set cluster.learners=2 $S
    $MPI -np 4 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/l21" --set grpo.max_steps=3 \
      --set cluster.learners=2 $S
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/l21" --set grpo.max_steps=6 $S
    $CHECK close "$W/l2" "$W/l21" 43 1e-3
    ;;
  learner_shard)  # learner.shard with 2 learners (mpirun): ZeRO-2 and ZeRO-3 are the data-parallel run bit for
    # bit with less state per learner; a ZeRO-2 checkpoint (one shard per learner) resumed as ZeRO-1 goes on as
    # the uninterrupted run; generate and consolidate read it; a ZeRO-3 one resumes on one learner
    S="--set optimizer.schedule=constant --set sft.max_steps=8 --set eval.every=0 --set eval.num_prompts=10 \
       --set checkpointing.every=2 --set rollout.prompts_per_step=8 --set cluster.transport=ipc \
       --set cluster.learners=2 $Q"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 4"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/dp" --set grpo.max_steps=4 $S
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/z2" --set grpo.max_steps=4 \
      --set learner.shard=gradients $S
    $CHECK same "$W/dp" "$W/z2"
    "$PY" - "$W/dp/metrics.jsonl" "$W/z2/metrics.jsonl" << 'EOS'
import json, sys
dp, z2 = ([r["learner/state_bytes"] for r in map(json.loads, open(p)) if "learner/state_bytes" in r] for p in sys.argv[1:])
assert dp and len(dp) == len(z2) and all(b < a for a, b in zip(dp, z2)), (dp, z2)
print("learner/state_bytes: data parallel", dp[0], "ZeRO-2", z2[0])
EOS
    grep -q '"learner_shard"' "$W/z2/checkpoints/latest/state.json"
    # ZeRO-3: the same run again, learner 0 holding less than under ZeRO-2 (sharded gradients)
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/z3" --set grpo.max_steps=4 \
      --set learner.shard=parameters $S
    $CHECK same "$W/dp" "$W/z3"
    "$PY" - "$W/z2/metrics.jsonl" "$W/z3/metrics.jsonl" << 'EOS'
import json, sys
z2, z3 = ([r["learner/state_bytes"] for r in map(json.loads, open(p)) if "learner/state_bytes" in r] for p in sys.argv[1:])
assert z2 and len(z2) == len(z3) and all(b < a for a, b in zip(z2, z3)), (z2, z3)
print("learner/state_bytes: ZeRO-2", z2[0], "ZeRO-3", z3[0])
EOS
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/z21" --set grpo.max_steps=2 \
      --set learner.shard=gradients $S
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/z21" --set grpo.max_steps=4 \
      --set learner.shard=optimizer $S
    $CHECK same "$W/dp" "$W/z21"
    # the checkpoints are sharded: one file per learner and shards.json, no gathered optimizer file
    L="$W/z21/checkpoints/latest"
    test -f "$L/shards.json" && test -f "$L/shards/rank_0.safetensors" && test -f "$L/shards/rank_1.safetensors"
    test ! -e "$L/optimizer.safetensors" && test ! -e "$L/model.safetensors"
    # read directly by generate, and consolidated into a Hugging Face directory that generates the same
    "$TROUPE" generate "$L" --prompt "12+7=" --max-tokens 8 --json > "$W/gen_sharded.json"
    "$TROUPE" checkpoint consolidate "$L" "$W/z21_hf"
    test -f "$W/z21_hf/model.safetensors" && test -f "$W/z21_hf/config.json"
    "$TROUPE" generate "$W/z21_hf" --prompt "12+7=" --max-tokens 8 --json > "$W/gen_hf.json"
    cmp "$W/gen_sharded.json" "$W/gen_hf.json"
    expect_exit 2 "$TROUPE" checkpoint consolidate "$W/dp/checkpoints/latest" "$W/not_sharded"
    grep -q "shards.json" "$W/err.txt"
    cp -r "$L/" "$W/bad_ckpt"
    printf 'x' | dd of="$W/bad_ckpt/shards/rank_1.safetensors" bs=1 seek=100 conv=notrunc 2> /dev/null
    expect_exit 2 "$TROUPE" checkpoint consolidate "$W/bad_ckpt" "$W/bad_hf"
    grep -q "rank_1.safetensors (rank 1 of 2)" "$W/err.txt"
    # a sharded save killed half-way (learner 0 dies after its model files, the shards written): latest
    # stays on the step before, no step_10, and --resume goes on as the uninterrupted run
    expect_exit nonzero $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/cut" --set grpo.max_steps=4 \
      --set learner.shard=gradients --set faults.checkpoint_interrupt_step=10 $S
    grep -q "fault injected: checkpoint of step 10 interrupted" "$W/err.txt"
    test "$(readlink "$W/cut/checkpoints/latest")" = step_8 && test ! -e "$W/cut/checkpoints/step_10"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/cut" --set grpo.max_steps=4 \
      --set learner.shard=gradients $S
    $CHECK same "$W/dp" "$W/cut"
    # 2 sharded learners -> 1 learner: read from the shards, then the 1-learner sum order (rounding)
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/z31" --set grpo.max_steps=2 \
      --set learner.shard=parameters $S
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/z31" --set grpo.max_steps=4 $S \
      --set cluster.learners=1
    $CHECK close "$W/dp" "$W/z31" 11 1e-3
    # LoRA adapters shard like parameters (on the data-parallel run's model as the base): each learner
    # writes its shard of the adapters; eval reads the checkpoint as it reads its consolidated PEFT
    # directory; a resume on one learner reads the shards
    base=$(readlink -f "$W/dp/checkpoints/latest")
    sed '/^  model:/,/^    max_position_embeddings/d' "$SRC/configs/quickstart.yaml" > "$W/lora.yaml"
    printf '  path: %s\n  lora:\n    rank: 4\n    targets: [q, v]\n' "$base" > "$W/lora_keys.txt"
    sed -i "/^  tokenizer: char/r $W/lora_keys.txt" "$W/lora.yaml"
    $MPI "$TROUPE" run "$W/lora.yaml" --set run.dir="$W/lz" --set sft.enabled=false --set grpo.max_steps=2 \
      --set learner.shard=parameters $S
    ck=$(readlink -f "$W/lz/checkpoints/latest")
    test -f "$ck/shards.json" && test -f "$ck/adapter_config.json" && test ! -e "$ck/adapter_model.safetensors"
    grep -q '"kind": "lora_adapter"' "$ck/shards.json"
    "$TROUPE" eval "$W/lora.yaml" --checkpoint "$ck" --set eval.num_prompts=10 > "$W/lora_eval.json"
    "$TROUPE" checkpoint consolidate "$ck" "$W/lz_peft"
    test -s "$W/lz_peft/adapter_model.safetensors" && test -s "$W/lz_peft/base.json"
    "$TROUPE" eval "$W/lora.yaml" --checkpoint "$W/lz_peft" --set eval.num_prompts=10 > "$W/lora_eval_peft.json"
    "$PY" - "$W/lora_eval.json" "$W/lora_eval_peft.json" << 'EOS'
import json, sys
a, b = ({k: v for k, v in json.load(open(p)).items() if k != "checkpoint" and not k.endswith("_s")} for p in sys.argv[1:])
assert a == b, (a, b)
print("eval of the sharded LoRA checkpoint == eval of its consolidation:", a.get("eval_accuracy", a))
EOS
    "$TROUPE" run "$W/lora.yaml" --resume "$W/lz" --set sft.enabled=false --set grpo.max_steps=3 $S \
      --set cluster.learners=1
    $CHECK steps "$W/lz" 3
    ;;
  expert_parallel_run)  # policy.moe.expert_parallel 2 over 2 learners (mpirun): each learner holds half the
    # experts, learner 0 too (learner/state_bytes: the data-parallel figure less 16 bytes per routed value not
    # held, no whole copy), the weights go to the generators from the blocks (rank 0 sends half of a full sync;
    # probe on, run by both learners together: the generators hold them bit for bit); the run equals the
    # data-parallel one bit for bit (one micro-batch per learner); its checkpoint (each learner writes its runs,
    # sharded) resumes at E 2 and at E 1 as the uninterrupted run; generate, eval and consolidate read it
    S="--set optimizer.schedule=constant --set sft.max_steps=12 --set eval.every=0 --set eval.num_prompts=10 \
       --set checkpointing.every=14 --set rollout.prompts_per_step=8 --set cluster.transport=ipc \
       --set cluster.learners=2 --set weight_sync.probe=true --set envs[0].config={\"digits\":1,\"terms\":1} $Q"
    EP="--set policy.moe.expert_parallel=2"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 4"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/dp" --set grpo.max_steps=4 $S
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ep" --set grpo.max_steps=4 $S $EP 2> "$W/ep.err"
    grep -q "weight sync: from the expert blocks of 2 learners" "$W/ep.err" || { cat "$W/ep.err"; exit 1; }
    $CHECK same "$W/dp" "$W/ep"
    "$PY" - "$W/dp/metrics.jsonl" "$W/ep/metrics.jsonl" "$W/ep/checkpoints/latest/shards.json" "$W/ep.err" << 'EOS'
import json, os, re, sys
dp, ep = ([r["learner/state_bytes"] for r in map(json.loads, open(p)) if "learner/state_bytes" in r] for p in sys.argv[1:3])
m = json.load(open(sys.argv[3]))  # the checkpoint: each learner's runs, no whole model.safetensors
assert m["layout"] == "expert_runs 2" and m["world_size"] == len(m["files"]) > 2, m["layout"]
assert not os.path.exists(os.path.join(os.path.dirname(sys.argv[3]), "model.safetensors"))
routed = 0  # the routed experts' values, from the checkpoint's tensor table
for t in m["tensors"]:
    if ".experts." in t["name"]:
        n = 1
        for d in t["shape"]:
            n *= d
        routed += n
assert routed > 0, m["tensors"]
# learner 0 holds half the experts and nothing whole: 16 bytes (weight, gradient, 2 moments) per value not held
assert dp and len(dp) == len(ep) and all(b == a - 16 * (routed // 2) for a, b in zip(dp, ep)), (dp, ep, routed)
print("learner/state_bytes of learner 0: data parallel", dp[0], "experts divided", ep[0])
rows = [tuple(map(int, m.groups())) for m in
        re.finditer(r"weight sync: version (\d+) in 2 pieces \(a delta to (\d+) generators, in full to (\d+)\): "
                    r"rank 0 sent (\d+) of the learners' (\d+) payload bytes", open(sys.argv[4]).read())]
assert len(rows) >= 2, rows
for v, delta, full, mine, all_ in rows:  # rank 0 sends its experts and half of the rest, never the whole message
    assert 0 < mine < all_, (v, mine, all_)
    if not delta:  # the full weights: half the values each
        assert abs(mine / all_ - 0.5) < 0.01, (v, mine, all_)
norms = [r["grad_norm"] for r in map(json.loads, open(sys.argv[2])) if r.get("phase") == "grpo" and "grad_norm" in r]
assert norms and any(n > 0 for n in norms), norms  # GRPO steps that change the weights the generators get
EOS
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ep2" --set grpo.max_steps=2 $S $EP
    cp -r "$W/ep2" "$W/ep1"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/ep2" --set grpo.max_steps=4 $S $EP
    $CHECK same "$W/dp" "$W/ep2"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/ep1" --set grpo.max_steps=4 $S
    $CHECK same "$W/dp" "$W/ep1"
    "$TROUPE" generate "$W/ep/checkpoints/latest" --prompt "1+2+3=" --max-tokens 4 --json > "$W/gen_ep.json"
    "$TROUPE" generate "$W/dp/checkpoints/latest" --prompt "1+2+3=" --max-tokens 4 --json > "$W/gen_dp.json"
    cmp "$W/gen_ep.json" "$W/gen_dp.json"
    "$TROUPE" checkpoint consolidate "$W/ep/checkpoints/latest" "$W/ep_whole"
    "$TROUPE" generate "$W/ep_whole" --prompt "1+2+3=" --max-tokens 4 --json > "$W/gen_whole.json"
    cmp "$W/gen_whole.json" "$W/gen_dp.json"
    "$TROUPE" eval "$SRC/configs/quickstart.yaml" --checkpoint "$W/ep/checkpoints/latest" --set eval.num_prompts=20 $Q \
      | tail -n 1 > "$W/eval_ep.json"
    "$TROUPE" eval "$SRC/configs/quickstart.yaml" --checkpoint "$W/dp/checkpoints/latest" --set eval.num_prompts=20 $Q \
      | tail -n 1 > "$W/eval_dp.json"
    $CHECK eval_json "$W/eval_ep.json"
    cmp <(sed 's/"checkpoint":"[^"]*",//' "$W/eval_ep.json") <(sed 's/"checkpoint":"[^"]*",//' "$W/eval_dp.json")
    ;;
  expert_parallel_run_4ranks)  # policy.moe.expert_parallel 2 over 4 learners (mpirun; DP 2 x EP 2): each learner
    # holds half the experts (each builds only its block at start-up); the run follows the 4-learner
    # data-parallel one within the documented rounding (the owners' groups sum their gradients before the
    # replicas do: another order); its checkpoint resumes bit for bit as the uninterrupted run
    S="--set optimizer.schedule=constant --set sft.max_steps=12 --set eval.every=0 --set eval.num_prompts=10 \
       --set checkpointing.every=14 --set rollout.prompts_per_step=8 --set cluster.transport=ipc \
       --set cluster.learners=4 --set envs[0].config={\"digits\":1,\"terms\":1} $Q"
    EP="--set policy.moe.expert_parallel=2"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 6"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/dp" --set grpo.max_steps=4 $S
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ep" --set grpo.max_steps=4 $S $EP
    $CHECK close "$W/dp" "$W/ep" 1 1e-5
    "$PY" - "$W/dp/metrics.jsonl" "$W/ep/metrics.jsonl" << 'EOS'
import json, sys
dp, ep = ([r["learner/state_bytes"] for r in map(json.loads, open(p)) if "learner/state_bytes" in r] for p in sys.argv[1:])
assert dp and len(dp) == len(ep) and all(b < a for a, b in zip(dp, ep)), (dp, ep)
print("learner/state_bytes of learner 0: data parallel", dp[0], "experts divided", ep[0])
EOS
    $CHECK moved "$W/ep"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ep2" --set grpo.max_steps=2 $S $EP
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/ep2" --set grpo.max_steps=4 $S $EP
    $CHECK same "$W/ep" "$W/ep2"
    ;;
  expert_parallel_zero_resume_2ranks)  # checkpoints across learner.shard and divided experts (mpirun, 2 learners):
    # a ZeRO-1 run's sharded checkpoint and a data-parallel run's whole one resumed by divided learners (shard
    # none, E 2, each reading only its own values), and a divided run's (sharded: each learner's runs) checkpoint
    # resumed as ZeRO-1, each go on as the uninterrupted data-parallel run, bit for bit
    # (2 learners: ZeRO-1 and E 2 with one micro-batch per learner are both data parallelism's bits)
    S="--set optimizer.schedule=constant --set sft.max_steps=12 --set eval.every=0 --set eval.num_prompts=10 \
       --set checkpointing.every=14 --set rollout.prompts_per_step=8 --set cluster.transport=ipc \
       --set cluster.learners=2 --set envs[0].config={\"digits\":1,\"terms\":1} $Q"
    EP="--set policy.moe.expert_parallel=2"
    Z1="--set learner.shard=optimizer"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 4"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/dp" --set grpo.max_steps=4 $S
    $CHECK moved "$W/dp"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/z1" --set grpo.max_steps=2 $S $Z1
    test -f "$W/z1/checkpoints/latest/shards.json"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/z1" --set grpo.max_steps=4 $S $EP
    $CHECK same "$W/dp" "$W/z1"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/whole" --set grpo.max_steps=2 $S
    test -f "$W/whole/checkpoints/latest/model.safetensors" && test ! -e "$W/whole/checkpoints/latest/shards.json"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/whole" --set grpo.max_steps=4 $S $EP
    $CHECK same "$W/dp" "$W/whole"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ep" --set grpo.max_steps=2 $S $EP
    test -f "$W/ep/checkpoints/latest/shards.json"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/ep" --set grpo.max_steps=4 $S $Z1
    $CHECK same "$W/dp" "$W/ep"
    ;;
  expert_parallel_kl_2ranks)  # loss.kl_coef > 0 with the experts divided over 2 learners (mpirun): the reference
    # model is a block too, its log-probs computed with the group; the run is the data-parallel one's bits
    S="--set optimizer.schedule=constant --set sft.max_steps=12 --set eval.every=0 --set eval.num_prompts=10 \
       --set checkpointing.enabled=false --set rollout.prompts_per_step=8 --set cluster.transport=ipc \
       --set cluster.learners=2 --set loss.kl_coef=0.1 --set envs[0].config={\"digits\":1,\"terms\":1} $Q"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 4"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/dp" --set grpo.max_steps=4 $S
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ep" --set grpo.max_steps=4 $S \
      --set policy.moe.expert_parallel=2
    $CHECK same "$W/dp" "$W/ep"
    "$PY" - "$W/ep/metrics.jsonl" << 'EOS'
import json, sys
g = [r for r in map(json.loads, open(sys.argv[1])) if r.get("phase") == "grpo" and "kl" in r]
# the reference is the run's first policy, before the SFT warm-up: KL > 0, and its gradient moves every step
assert len(g) == 4 and all(r["kl"] > 0 and r["grad_norm"] > 0 for r in g), g
print("kl of the divided run:", [r["kl"] for r in g])
EOS
    ;;
  expert_parallel_model_dir_2ranks)  # policy.path (a transformers-made MoE directory, fused experts) with the experts
    # divided over 2 learners (mpirun): learner 1 and both reference models read only their experts' rows
    # (policy::io::load_expert_block); the run is the data-parallel one's bits, KL included
    $PY -c "import re,sys; t=open(sys.argv[1]).read(); open(sys.argv[2],'w').write(re.sub(r'\n  model:\n(    .*\n)+', '\n', t))" \
      "$SRC/configs/quickstart.yaml" "$W/loaded.yaml"
    S="--set policy.path=$SRC/tests/hf_fixture/qwen3_moe_fused --set policy.tokenizer=auto --set sft.max_steps=4 \
       --set eval.every=0 --set eval.num_prompts=10 --set checkpointing.enabled=false --set rollout.prompts_per_step=8 \
       --set cluster.transport=ipc --set cluster.learners=2 --set loss.kl_coef=0.1 $Q"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 4"
    $MPI "$TROUPE" run "$W/loaded.yaml" --set run.dir="$W/dp" --set grpo.max_steps=3 $S
    $MPI "$TROUPE" run "$W/loaded.yaml" --set run.dir="$W/ep" --set grpo.max_steps=3 $S --set policy.moe.expert_parallel=2
    $CHECK same "$W/dp" "$W/ep"
    ;;
  expert_parallel_compose_run)  # policy.moe.expert_parallel 2 over 2 learners (mpirun) beside LoRA (adapters on
    # every module and routed expert; every learner holds every expert) and distillation (the reverse-KL term,
    # a teacher on one scorer): each equals its data-parallel run bit for bit (one micro-batch per learner);
    # streamed parts (rollout.async with async_chunks 2) train with E 2 (grad_norm > 0 every step; against
    # data parallelism: expert_parallel_run_stream).
    # Each again with learner.shard: parameters (ZeRO-3): LoRA and distillation equal the data-parallel run,
    # streamed parts the E 2 run with shard none, and the ZeRO-3 LoRA run resumed from its checkpoint goes on
    # as the uninterrupted data-parallel one
    S="--set optimizer.schedule=constant --set sft.max_steps=4 --set eval.every=0 --set eval.num_prompts=10 \
       --set checkpointing.enabled=false --set rollout.prompts_per_step=8 --set cluster.transport=ipc \
       --set cluster.learners=2 --set envs[0].config={\"digits\":1,\"terms\":1} $Q"
    EP="--set policy.moe.expert_parallel=2"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root"
    L="--set policy.lora.rank=4 --set policy.lora.targets=all_linear --set grpo.max_steps=3"
    $MPI -np 4 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/lora_dp" $L $S
    $MPI -np 4 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/lora_ep" $L $S $EP
    $CHECK same "$W/lora_dp" "$W/lora_ep"
    Z="--set learner.shard=parameters"
    $MPI -np 4 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/lora_ez" $L $S $EP $Z
    $CHECK same "$W/lora_dp" "$W/lora_ez"
    R="--set checkpointing.enabled=true"
    $MPI -np 4 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/lora_ez2" $L $S $EP $Z $R \
      --set grpo.max_steps=2
    test -f "$W/lora_ez2/checkpoints/latest/shards.json"
    $MPI -np 4 "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/lora_ez2" $L $S $EP $Z $R
    $CHECK same "$W/lora_dp" "$W/lora_ez2"
    "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/teacher" --set grpo.enabled=false \
      --set sft.max_steps=4 --set eval.every=0 --set eval.num_prompts=10 $Q
    D="--set sft.enabled=false --set distill.teacher=$(readlink -f "$W/teacher/checkpoints/latest") \
       --set cluster.scorers=1 --set grpo.max_steps=3"
    $MPI -np 5 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/distill_dp" $D $S
    $MPI -np 5 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/distill_ep" $D $S $EP
    $CHECK same "$W/distill_dp" "$W/distill_ep"
    grep -q '"distill/reverse_kl"' "$W/distill_ep/metrics.jsonl"
    $MPI -np 5 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/distill_ez" $D $S $EP $Z
    $CHECK same "$W/distill_dp" "$W/distill_ez"
    # (12 SFT steps and a format reward of 0.5 for a wrong number: rewards differ within groups, a
    # gradient every step)
    A="--set sft.max_steps=12 --set grpo.max_steps=3 --set rollout.async=true --set rollout.async_chunks=2 \
       --set envs[0].config={\"digits\":1,\"terms\":1,\"format_reward\":0.5}"
    $MPI -np 4 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/stream_ep" $S $A $EP
    "$PY" - "$W/stream_ep/metrics.jsonl" << 'EOS'
import json, sys
norms = [r["grad_norm"] for r in map(json.loads, open(sys.argv[1])) if r.get("phase") == "grpo" and "grad_norm" in r]
assert len(norms) == 3 and all(n > 0 for n in norms), norms
print("streamed parts with E 2: grad_norm", norms)
EOS
    $MPI -np 4 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/stream_ez" $S $A $EP $Z
    $CHECK same "$W/stream_ep" "$W/stream_ez"
    ;;
  expert_parallel_run_stream)  # streamed parts (rollout.async, async_chunks 3) over 2 learners (mpirun) with the
    # experts' compute split (policy.moe.expert_parallel 2) against the same streamed run with data parallelism:
    # every GRPO step updates (a format reward of 0.5 for a wrong number: rewards differ within groups,
    # grad_norm > 0), the 12 SFT steps are the same bits, and the GRPO steps agree within the documented 1e-6
    # (relative; several parts per learner sum in another order) in every metric
    S="--set optimizer.schedule=constant --set sft.max_steps=12 --set eval.every=0 --set eval.num_prompts=10 \
       --set checkpointing.every=100 --set rollout.prompts_per_step=8 --set cluster.transport=ipc \
       --set cluster.learners=2 --set rollout.async=true --set rollout.async_chunks=3 --set grpo.max_steps=4 \
       --set envs[0].config={\"digits\":1,\"terms\":1,\"format_reward\":0.5} $Q"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 4"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/dp" $S
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ep" $S --set policy.moe.expert_parallel=2
    "$PY" - "$W/dp/metrics.jsonl" "$W/ep/metrics.jsonl" << 'EOS'
import json, sys
for p in sys.argv[1:]:
    g = [r for r in map(json.loads, open(p)) if r.get("phase") == "grpo" and "grad_norm" in r]
    assert g and all(r["grad_norm"] > 0 and r["reward_std"] > 0 for r in g), [(r["grad_norm"], r["reward_std"]) for r in g]
    print(p, "grad_norm", [round(r["grad_norm"], 6) for r in g])
EOS
    $CHECK close "$W/dp" "$W/ep" 13 1e-6
    "$PY" - "$W/dp/checkpoints/latest/model.safetensors" "$W/ep/checkpoints/latest/model.safetensors" << 'EOS'
import json, struct, sys
import numpy as np
def tensors(path):  # safetensors: an 8-byte header length, the JSON header, the data
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32)
            for k, v in head.items() if k != "__metadata__" and v["dtype"] == "F32"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
worst = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]) / (1 + np.abs(a[k])))) for k in a)
assert worst <= 1e-6, worst
moved = sum(int(np.any(a[k] != b[k])) for k in a)
print("the final weights: %d tensors, within %.3g (relative) of data parallelism's, %d not bit for bit" % (len(a), worst, moved))
EOS
    ;;
  expert_parallel_fenced_run)  # policy.moe.expert_parallel 2 over 2 learners on policy.device cpu_fenced
    # (mpirun): the learners divide the experts on the device path (their blocks in device memory the host
    # cannot touch, host mirrors, the backend's layer over the group's MPI exchange; the weight sync from the
    # blocks, probe on; activation checkpointing); the metrics equal the same run on cpu bit for bit, also
    # resumed from the fenced run's checkpoint (each learner's runs)
    S="--set optimizer.schedule=constant --set sft.max_steps=12 --set eval.every=0 --set eval.num_prompts=10 \
       --set checkpointing.every=14 --set rollout.prompts_per_step=8 --set cluster.transport=ipc \
       --set cluster.learners=2 --set weight_sync.probe=true --set envs[0].config={\"digits\":1,\"terms\":1} \
       --set policy.moe.expert_parallel=2 --set policy.activation_checkpointing=true $Q"
    F="--set policy.device=cpu_fenced"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 4"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/cpu" --set grpo.max_steps=4 $S
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/fenced" --set grpo.max_steps=4 $S $F \
      2> "$W/fenced.err"
    grep -q "weight sync: from the expert blocks of 2 learners" "$W/fenced.err" || { cat "$W/fenced.err"; exit 1; }
    $CHECK same "$W/cpu" "$W/fenced"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/fenced2" --set grpo.max_steps=2 $S $F
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/fenced2" --set grpo.max_steps=4 $S $F
    $CHECK same "$W/cpu" "$W/fenced2"
    ;;
  shard_fenced_run)  # learner.shard over 2 learners on policy.device cpu_fenced (mpirun): the sharded step on
    # the device (each learner's shard of the moments in device memory the host cannot touch, the gradients
    # reduce-scattered and the weights all-gathered by the host-staged device collective, the norm chained
    # through the learners; parameters maps each layer into a sparse device arena); optimizer and parameters
    # equal the data-parallel run on cpu bit for bit (parameters also with a bf16 weight sync, its probe run
    # from the shards), and a fenced gradients run checkpointed at step 2 resumes as parameters into the same
    # metrics
    S="--set optimizer.schedule=constant --set sft.max_steps=12 --set eval.every=0 --set eval.num_prompts=10 \
       --set checkpointing.every=2 --set rollout.prompts_per_step=8 --set cluster.transport=ipc \
       --set cluster.learners=2 --set envs[0].config={\"digits\":1,\"terms\":1} $Q"
    F="--set policy.device=cpu_fenced"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 4"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/dp" --set grpo.max_steps=4 $S
    for stage in optimizer parameters; do
      $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/$stage" --set grpo.max_steps=4 \
        --set learner.shard=$stage $S $F
      $CHECK same "$W/dp" "$W/$stage"
    done
    # bf16 weight sync: the probe's forward runs from the device shards, each gathered layer rounded
    # on the way (Trainer::forward_from_shards on the sparse arena); the generators check it
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/dp16" --set grpo.max_steps=2 \
      --set weight_sync.dtype=bf16 $S
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/p16" --set grpo.max_steps=2 \
      --set weight_sync.dtype=bf16 --set learner.shard=parameters $S $F
    $CHECK same "$W/dp16" "$W/p16"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/resumed" --set grpo.max_steps=2 \
      --set learner.shard=gradients $S $F
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/resumed" --set grpo.max_steps=4 \
      --set learner.shard=parameters $S $F
    $CHECK same "$W/dp" "$W/resumed"
    # the 4 ranks share the --resume's checksum reads: a corrupt shard of the latest checkpoint is named by
    # the rank that read it, every rank exits 2, and nothing in the run directory changes
    SHARD="$(readlink -f "$W/resumed/checkpoints/latest")/shards/rank_1.safetensors"
    ROWS=$(wc -l < "$W/resumed/metrics.jsonl")
    "$PY" -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(-9, 2); b = f.read(1); f.seek(-9, 2); f.write(bytes([b[0] ^ 0x5a]))' "$SHARD"
    expect_exit 2 $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/resumed" --set grpo.max_steps=6 \
      --set learner.shard=parameters $S $F
    grep -q "rank [0-3]: .*rank_1.safetensors (rank 1 of 2) fails its checksum" "$W/err.txt" || { cat "$W/err.txt"; exit 1; }
    grep -q "Earlier checkpoints that are whole" "$W/err.txt" || { cat "$W/err.txt"; exit 1; }
    [ "$(wc -l < "$W/resumed/metrics.jsonl")" = "$ROWS" ] || { echo "the refused --resume changed metrics.jsonl"; exit 1; }
    ;;
  shard_expert_parallel_run)  # policy.moe.expert_parallel 2 with learner.shard: parameters over 2 learners
    # (mpirun): each learner keeps its ZeRO-3 shard of the whole model (every expert), gathers each layer and
    # computes its half of the experts for both learners' routed rows; the run (weights synced from the
    # shards, probe on) equals the data-parallel one bit for bit (one micro-batch per learner), and its
    # checkpoint resumes into the uninterrupted run
    S="--set optimizer.schedule=constant --set sft.max_steps=12 --set eval.every=0 --set eval.num_prompts=10 \
       --set checkpointing.every=14 --set rollout.prompts_per_step=8 --set cluster.transport=ipc \
       --set cluster.learners=2 --set weight_sync.probe=true --set envs[0].config={\"digits\":1,\"terms\":1} $Q"
    EZ="--set policy.moe.expert_parallel=2 --set learner.shard=parameters"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 4"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/dp" --set grpo.max_steps=4 $S
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ez" --set grpo.max_steps=4 $S $EZ 2> "$W/ez.err"
    grep -q "weight sync: from the shards of 2 learners" "$W/ez.err" || { cat "$W/ez.err"; exit 1; }
    $CHECK same "$W/dp" "$W/ez"
    "$PY" - "$W/ez/metrics.jsonl" << 'EOS'
import json, sys
norms = [r["grad_norm"] for r in map(json.loads, open(sys.argv[1])) if r.get("phase") == "grpo" and "grad_norm" in r]
assert norms and any(n > 0 for n in norms), norms  # GRPO steps that change the weights the generators get
EOS
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ez2" --set grpo.max_steps=2 $S $EZ
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/ez2" --set grpo.max_steps=4 $S $EZ
    $CHECK same "$W/dp" "$W/ez2"
    ;;
  expert_parallel_sync)  # weight sync from the expert blocks of 2 learners (mpirun, policy.moe.expert_parallel 2):
    # bf16 deltas with full_every to 3 generators (relay fan-out 2: the first level puts the runs together),
    # probes on; the generators hold the data-parallel run's weights bit for bit (the same metrics); and on
    # 4 learners (2 groups)
    S="--set sft.max_steps=8 --set grpo.max_steps=4 --set optimizer.schedule=constant --set optimizer.lr=1e-6 --set eval.every=0 \
       --set eval.num_prompts=10 --set checkpointing.enabled=false --set rollout.prompts_per_step=8 --set cluster.transport=ipc \
       --set cluster.learners=2 --set cluster.generators=3 --set weight_sync.relay_fanout=2 --set weight_sync.probe=true \
       --set weight_sync.dtype=bf16 --set weight_sync.full_every=3 --set envs[0].config={\"digits\":1,\"terms\":1} $Q"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 6"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/dp" $S
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ep" $S --set policy.moe.expert_parallel=2 \
      2> "$W/ep.err"
    grep -q "weight sync: from the expert blocks of 2 learners" "$W/ep.err" || { cat "$W/ep.err"; exit 1; }
    $CHECK same "$W/dp" "$W/ep"
    "$PY" - "$W/ep.err" << 'EOS'
import re, sys
rows = [tuple(map(int, m.groups())) for m in
        re.finditer(r"weight sync: version (\d+) in 2 pieces \(a delta to (\d+) generators, in full to (\d+)\): "
                    r"rank 0 sent (\d+) of the learners' (\d+) payload bytes", open(sys.argv[1]).read())]
assert len(rows) >= 5, rows
assert all(delta + full == 3 and 0 < mine < all_ for _, delta, full, mine, all_ in rows), rows
assert any(delta for _, delta, _, _, _ in rows), rows  # deltas travel from the blocks too
print("rank 0's share of the bytes per sync:", [round(m / a, 3) for _, _, _, m, a in rows])
EOS
    # 4 learners (data-parallel 2 x E 2): the first group sends, the second answers with no values; both
    # groups run the probe, which every generator passes (else the run stops)
    $MPIEXEC --oversubscribe --allow-run-as-root -np 7 "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/ep4" \
      $S --set sft.max_steps=4 --set grpo.max_steps=3 --set cluster.learners=4 --set cluster.generators=2 \
      --set policy.moe.expert_parallel=2 2> "$W/ep4.err" || { cat "$W/ep4.err"; exit 1; }
    grep -q "weight sync: version 7 in 2 pieces" "$W/ep4.err" || { cat "$W/ep4.err"; exit 1; }
    $CHECK steps "$W/ep4" 7
    ;;
  shard_weight_sync)  # weight sync from the shards of 2 learners (mpirun): every learner encodes its own shard
    # and sends it to the generators itself; the generators (3, relay fan-out 2: a relay tree whose first
    # level puts the pieces together) train bit for bit as with shard none, in bf16 deltas with full_every,
    # probes on (computed layer by layer from the shards), also resumed from a ZeRO-3 checkpoint; rank 0
    # sends only learner 0's piece; pieces that come back part delta, part full; and in an async run
    # (fp32, one generator)
    S="--set sft.max_steps=12 --set grpo.max_steps=5 --set optimizer.schedule=constant --set optimizer.lr=1e-6 --set eval.every=0 \
       --set eval.num_prompts=10 --set checkpointing.enabled=false --set rollout.prompts_per_step=8 --set cluster.transport=ipc \
       --set cluster.learners=2 --set cluster.generators=3 --set weight_sync.relay_fanout=2 \
       --set weight_sync.dtype=bf16 --set weight_sync.full_every=3 --set envs[0].config={\"digits\":1,\"terms\":1} $Q"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 6"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/none" $S 2> "$W/none.err"
    ! grep -q "weight sync: from the shards" "$W/none.err"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/z3" --set learner.shard=parameters $S \
      2> "$W/z3.err"
    grep -q "weight sync: from the shards of 2 learners" "$W/z3.err" || { cat "$W/z3.err"; exit 1; }
    $CHECK same "$W/none" "$W/z3"
    "$PY" - "$W/z3.err" << 'EOS'
import re, sys
rows = [tuple(map(int, m.groups())) for m in
        re.finditer(r"weight sync: version (\d+) in 2 pieces \(a delta to (\d+) generators, in full to (\d+)\): "
                    r"rank 0 sent (\d+) of the learners' (\d+) payload bytes", open(sys.argv[1]).read())]
assert len(rows) >= 6, rows  # the first sync, one per GRPO step (and the SFT phase's)
for v, delta, full, mine, all_ in rows:
    assert delta + full == 3, (v, delta, full)
    assert 0 < mine < all_, (v, mine, all_)  # rank 0 sent learner 0's piece, never the whole message
    if full:  # the full weights: learner 0's share of the values, half
        assert abs(mine / all_ - 0.5) < 0.01, (v, mine, all_)
assert any(delta for _, delta, _, _, _ in rows), rows  # deltas travel in pieces too
print("rank 0's share of the bytes per sync:", [round(m / a, 3) for _, _, _, m, a in rows])
EOS
    "$PY" - "$W/z3/metrics.jsonl" << 'EOS'
import json, sys
norms = [r["grad_norm"] for r in map(json.loads, open(sys.argv[1])) if r.get("phase") == "grpo" and "grad_norm" in r]
assert norms and any(n > 0 for n in norms), norms  # the GRPO steps change the weights the generators get
EOS
    # At lr 4e-6 one shard's bf16 delta of a sync is past its lean cap (1/16 of the piece) while the
    # other's is not: every learner is asked in full again, and the run still trains as shard none
    M="--set optimizer.lr=4e-6"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/none_m" $S $M
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/z3_m" --set learner.shard=parameters $S $M \
      2> "$W/z3_m.err"
    grep -q "some learners' pieces are deltas, others went in full" "$W/z3_m.err" || { cat "$W/z3_m.err"; exit 1; }
    $CHECK same "$W/none_m" "$W/z3_m"
    # ZeRO-3 checkpointed after GRPO step 2 and resumed on 2 learners: each reads only its own share
    # of the moments and its shard of the weights, and the run goes on as the uninterrupted one
    C="--set checkpointing.enabled=true --set checkpointing.every=100"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/z3r" --set learner.shard=parameters $S $C \
      --set grpo.max_steps=2
    test -f "$W/z3r/checkpoints/latest/shards/rank_1.safetensors"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --resume "$W/z3r" --set learner.shard=parameters $S $C
    $CHECK same "$W/none" "$W/z3r"
    A="--set rollout.async=true --set weight_sync.dtype=fp32 --set cluster.generators=1"
    MPI="$MPIEXEC --oversubscribe --allow-run-as-root -np 4"
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/none_async" $S $A
    $MPI "$TROUPE" run "$SRC/configs/quickstart.yaml" --set run.dir="$W/z1_async" --set learner.shard=optimizer $S $A
    $CHECK same "$W/none_async" "$W/z1_async"
    ;;
  shard_sync_learner_death|expert_parallel_learner_death)  # weight sync from the shards (learner.shard
    # parameters) or the expert blocks (policy.moe.expert_parallel 2) of 2 learners (mpirun): learner rank 1 is
    # SIGKILLed as it sends its piece of version 2; the coordinator names it (rank, role) and the run stops
    rank_wrapper
    HOW="--set learner.shard=parameters"
    [ "$CASE" = expert_parallel_learner_death ] && HOW="--set policy.moe.expert_parallel=2"
    S="--set sft.max_steps=0 --set sft.enabled=false --set grpo.max_steps=4 --set eval.every=0 --set eval.num_prompts=10 \
       --set checkpointing.enabled=false --set rollout.prompts_per_step=8 --set cluster.learners=2 --set cluster.generators=1 \
       $HOW --set cluster.peer_timeout_s=5 $Q"
    "$MPIEXEC" --oversubscribe --allow-run-as-root --enable-recovery -x RANKDIR -np 4 bash "$W/rank.sh" "$TROUPE" run \
      "$SRC/configs/quickstart.yaml" --set run.dir="$W/run" $S --set faults.learner_death_sync=2 \
      --set faults.learner_death_rank=1 2> "$W/err.txt" || true
    grep -v PMIX "$W/err.txt" | tail -8
    grep -q "fault injected: learner rank 1 killed while it sends its piece of version 2" "$W/err.txt"
    grep -q "learner 1 (node 1) failed while sending its piece of version 2" "$W/err.txt"
    test "$(cat "$W/rc_0")" != 0
    ;;
  *) echo "unknown case $CASE"; exit 2 ;;
esac
echo "e2e.$CASE ok"
