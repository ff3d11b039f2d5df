#!/usr/bin/env bash
# learner.shard_dead_rank: runs learner_shard_dead_rank under mpirun -np 2 (--enable-recovery, so
# the survivor is not killed by mpirun first) and checks that rank 0's watchdog names the dead rank,
# its role and the ZeRO-3 collective it was waiting in; with MODE `device`, the staged reduce-scatter
# of a ZeRO-2 step on a device model; with `device_zero3`, the all-gather of a ZeRO-3 layer on a
# device model's sparse arena. Usage: shard_dead_rank.sh MPIEXEC BINARY [device|device_zero3]
set -u
MPIEXEC=$1 BIN=$2 MODE=${3:-}
err=$(mktemp)
trap 'rm -f "$err"' EXIT
"$MPIEXEC" --oversubscribe --allow-run-as-root --enable-recovery -np 2 --mca btl self,tcp \
  --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "$BIN" $MODE 2> "$err" > /dev/null
grep -v PMIX "$err" | grep -E "PROBE|troupe: rank 0" | head -5
grep -q "rank 0 (role learner0): peer rank 1 (role learner1) failed" "$err" || { echo "the dead rank is not named"; exit 1; }
if [ "$MODE" = device ]; then
  want="this rank was blocked in MPI_Alltoallv (the learners' gradient reduce-scatter)"
else
  want="this rank was blocked in learner.shard parameters: the all-gather of decoder layer"
fi
grep -q "$want" "$err" || { echo "the collective is not named"; cat "$err"; exit 1; }
echo "learner.shard_dead_rank ok"
