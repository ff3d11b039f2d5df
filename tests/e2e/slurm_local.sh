#!/usr/bin/env bash
# A throwaway single-node SLURM on 127.0.0.1, for tests that launch with srun.
#   slurm_local.sh start DIR   munged + slurmctld + slurmd with their own key, sockets, ports and
#                              state under DIR (DIR must not exist yet, or be empty); prints the
#                              SLURM_CONF path on stdout once `srun` works
#   slurm_local.sh stop DIR    stops the three daemons started in DIR (safe to call twice)
# Needs root (slurmd starts the tasks) and Debian's slurmctld slurmd slurm-client munge packages;
# exits 77 when they are missing (ctest reads that as SKIPPED). Nothing outside DIR is written and
# nothing listens beyond 127.0.0.1; the node declares 8 CPUs so 4 tasks fit on a 2-core machine.
set -euo pipefail
cmd=${1:?usage: slurm_local.sh start|stop DIR} D=${2:?usage: slurm_local.sh start|stop DIR}

stop() {
  local f pid
  if [ -f "$D/run/slurmctld.pid" ] && [ -f "$D/slurm.conf" ]; then  # end this cluster's jobs (their tasks) first
    SLURM_CONF=$D/slurm.conf timeout 10 scancel --quiet --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(SLURM_CONF=$D/slurm.conf timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  for f in slurmd slurmctld munged; do
    [ -f "$D/run/$f.pid" ] || continue
    pid=$(cat "$D/run/$f.pid" 2>/dev/null || true)
    rm -f "$D/run/$f.pid"
    [ -n "$pid" ] || continue
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "slurm_local.sh: unknown command $cmd" >&2; exit 2; }

for b in munged slurmctld slurmd srun scontrol; do
  command -v "$b" > /dev/null || { echo "slurm_local.sh: $b not installed (apt-get install slurmctld slurmd slurm-client munge)" >&2; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "slurm_local.sh: needs root (slurmd runs the tasks)" >&2; exit 77; }

mkdir -p "$D"
D=$(cd "$D" && pwd)
mkdir -p "$D"/{run,log,state,spool}
chmod 700 "$D" "$D/run"
trap 'rc=$?; if [ $rc -ne 0 ]; then stop; for l in "$D"/log/*; do echo "== $l" >&2; tail -20 "$l" >&2; done; fi' EXIT

# two free ports on 127.0.0.1 (asked of the kernel, so they do not clash with anything listening)
read -r ctld_port slurmd_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')

dd if=/dev/urandom of="$D/munge.key" bs=1024 count=1 status=none
chmod 400 "$D/munge.key"
# (the daemons fork into the background; their stdio goes to log/*.out, not to the caller's pipes)
munged --force --socket="$D/run/munge.sock" --key-file="$D/munge.key" --pid-file="$D/run/munged.pid" \
  --log-file="$D/log/munged.log" --seed-file="$D/run/munged.seed" < /dev/null >> "$D/log/munged.out" 2>&1

cat > "$D/slurm.conf" <<EOF
ClusterName=troupe-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/run/munge.sock
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
PlugStackConfig=$D/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
CommunicationParameters=NoInAddrAny
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=10
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
: > "$D/plugstack.conf"
export SLURM_CONF=$D/slurm.conf
slurmctld -f "$SLURM_CONF" -i < /dev/null >> "$D/log/slurmctld.out" 2>&1
slurmd -f "$SLURM_CONF" -N localhost < /dev/null >> "$D/log/slurmd.out" 2>&1

# ready when the node is idle (slurmd registered with the controller)
for _ in $(seq 100); do
  state=$(sinfo -h -N -o %t 2>/dev/null || true)
  [ "$state" = idle ] && { echo "$SLURM_CONF"; exit 0; }
  sleep 0.2
done
echo "slurm_local.sh: the node did not come up (sinfo says '${state:-nothing}')" >&2
exit 1
