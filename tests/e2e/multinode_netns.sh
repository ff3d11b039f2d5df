#!/usr/bin/env bash
# e2e.multinode_netns: configs/multinode.yaml on two hosts, played by two network namespaces of
# this machine joined by a veth pair (tr0 in both: 10.251.0.1/30 in A, .2 in B; the addresses exist
# only inside the two namespaces). Each host has its own CURVE key pair at the same path (a bind
# mount per host, as each real node keeps its own file); one authorized_keys file lists both.
# mpirun runs in A with a hostfile of the two addresses and starts its daemon in B through
# ssh.sh, a stand-in for ssh (plm_rsh_agent); MPI and troupe both cross only the veth (btl and oob
# on tr0; cluster.bind_host: tr0, which each rank resolves to its own host's address).
# Checks: the run trains (metrics rows, every artifact); ranks 0, 2 ran in A and 1, 3 in B, each
# listening on its own host's address; a capture on the veth (wire_capture.py) sees an env
# string in the troupe traffic of a run without CURVE and none in the CURVE run's; with an
# unlisted key on host B, B's connections are refused (naming B's address and key) and the run
# fails within the peer timeout; a bind_host that is host A's address stops host B's ranks,
# naming it.
# Exits 77 (ctest: skipped) where namespaces cannot be made (not root, no iproute2, a container
# without CAP_SYS_ADMIN), saying why. The namespaces go away on every exit.
#   multinode_netns.sh TROUPE PYTHON SOURCE_DIR WORK_DIR [MPIEXEC]
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 WORK=$4 MPIEXEC=${5:-mpirun}
CHECK="$PY $SRC/tests/e2e/check_run.py"
W=$WORK/multinode_netns
skip() {
  echo "SKIP e2e.multinode_netns: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root"
rm -rf "$W" && mkdir -p "$W"
command -v ip > /dev/null || skip "no ip command (iproute2)"
command -v timeout > /dev/null || skip "no timeout command"

A=troupe_a$$ B=troupe_b$$ NET=10.251.0
cleanup() {  # processes left in the namespaces (a run past its timeout), then the namespaces and their veth
  for ns in $A $B; do
    pids=$(ip netns pids "$ns" 2> /dev/null || true)
    if [ -n "$pids" ]; then kill -9 $pids 2> /dev/null || true; fi
    ip netns del "$ns" 2> /dev/null || true
  done
}
trap cleanup EXIT
try() {  # try WHAT CMD...: CMD, or skip naming WHAT and CMD's error
  local what=$1
  shift
  "$@" 2> "$W/setup_err.txt" || skip "cannot $what: $(tr '\n' ' ' < "$W/setup_err.txt")"
}
try "create a network namespace" ip netns add $A
try "create a network namespace" ip netns add $B
try "create a veth pair between namespaces" ip -n $A link add tr0 type veth peer name tr0 netns $B
ip -n $A addr add $NET.1/30 dev tr0
ip -n $B addr add $NET.2/30 dev tr0
for ns in $A $B; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set tr0 up
done
try "run a command in a namespace" ip netns exec $A true
mkdir -p "$W/keys" "$W/hostA" "$W/hostB" "$W/hostX"
try "bind-mount in a namespace" ip netns exec $A mount --bind "$W/hostA" "$W/keys"

# each host's own key pair; authorized_keys lists A's and B's, never X's
"$TROUPE" keygen "$W/hostA/rank.pub" "$W/hostA/rank.sec" > "$W/authorized_keys"
"$TROUPE" keygen "$W/hostB/rank.pub" "$W/hostB/rank.sec" >> "$W/authorized_keys"
"$TROUPE" keygen "$W/hostX/rank.pub" "$W/hostX/rank.sec" > /dev/null

# the remote shell: HOST COMMAND... runs COMMAND (as ssh would, through a shell) in HOST's
# namespace with that host's keys mounted at $W/keys ($HOSTB_KEYS: the directory host B mounts)
cat > "$W/ssh.sh" << EOS
#!/usr/bin/env bash
host=\$1
shift
case \$host in
  $NET.2) exec ip netns exec $B sh -c "mount --bind '\$HOSTB_KEYS' '$W/keys' || exit 1; \$*" ;;
  *) echo "ssh.sh: no host \$host" >&2; exit 1 ;;
esac
EOS
chmod +x "$W/ssh.sh"
printf '%s slots=2\n%s slots=2\n' $NET.1 $NET.2 > "$W/hostfile"
# each rank records its network namespace and the key its host mounted, then becomes troupe
cat > "$W/rank.sh" << 'EOS'
echo "$(readlink /proc/self/ns/net) $(cat "$KEYDIR/rank.pub")" > "$RANKDIR/where_$OMPI_COMM_WORLD_RANK"
exec "$@"
EOS
export RANKDIR=$W KEYDIR=$W/keys
S="--set cluster.transport=tcp --set cluster.bind_host=tr0 --set cluster.curve=true
   --set cluster.curve_public_key=$W/keys/rank.pub --set cluster.curve_secret_key=$W/keys/rank.sec
   --set cluster.curve_authorized_keys=$W/authorized_keys --set sft.max_steps=5 --set grpo.max_steps=3
   --set eval.num_prompts=10 --set logger.progress=plain"
# run LIMIT_S NAME [--set ...]: mpirun in A (host A's keys mounted), ranks by node: 0, 2 in A; 1, 3 in B
run() {
  local limit=$1 name=$2
  shift 2
  rm -f "$W"/where_* "$W/log_$name.txt"
  timeout -k 5 "$limit" ip netns exec $A bash -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' _ "$W/hostA" "$W/keys" \
    "$MPIEXEC" --oversubscribe --allow-run-as-root --hostfile "$W/hostfile" --map-by node -np 4 \
    --mca plm_rsh_agent "$W/ssh.sh" --mca btl self,tcp --mca btl_tcp_if_include tr0 --mca oob_tcp_if_include tr0 \
    -x RANKDIR -x KEYDIR bash "$W/rank.sh" "$TROUPE" run "$SRC/configs/multinode.yaml" --set run.dir="$W/$name" $S "$@" \
    > "$W/log_$name.txt" 2>&1
}

# captured LIMIT_S NAME [--set ...]: run, with every frame crossing the veth saved in $W/wire_NAME.bin
# (by wire_capture.py in A), then wire_check NAME WANT: the troupe tcp payload between the hosts
# holds MARKER (WANT present) or not (absent)
captured() {
  local limit=$1 name=$2 rc=0
  ip netns exec $A timeout -k 2 $((limit + 10)) "$PY" "$SRC/tests/e2e/wire_capture.py" capture tr0 "$W/wire_$name.bin" \
    $((limit + 10)) > "$W/capture_$name.txt" 2>&1 &
  local cap=$!
  for _ in $(seq 1 100); do grep -qs capturing "$W/capture_$name.txt" && break; sleep 0.1; done
  grep -qs capturing "$W/capture_$name.txt" || { cat "$W/capture_$name.txt"; echo "the capture did not start"; exit 1; }
  run "$@" || rc=$?
  kill -TERM $cap
  wait $cap || true
  if [ $rc != 0 ]; then grep -v PMIX "$W/log_$name.txt" | tail -20 || true; echo "run $name failed (exit $rc)"; exit 1; fi
}
wire_check() {
  ports=$(grep "troupe: 4 ranks:" "$W/log_$1.txt" | grep -o 'tcp://[0-9.]*:[0-9]*' | sed 's/.*://')
  MARKER=$MARKER WANT=$2 "$PY" "$SRC/tests/e2e/wire_capture.py" payload "$W/wire_$1.bin" $ports
}

t0=$(date +%s)
export HOSTB_KEYS=$W/hostB
captured 120 run
echo "two-host run: $(( $(date +%s) - t0 )) s"
$CHECK files "$W/run"
$CHECK steps "$W/run" 8
# ranks 0, 2 in A and 1, 3 in B, each with its host's key
nsA=$(ip netns exec $A readlink /proc/self/ns/net)
nsB=$(ip netns exec $B readlink /proc/self/ns/net)
for r in 0 1 2 3; do
  if [ $((r % 2)) = 0 ]; then want="$nsA $(cat "$W/hostA/rank.pub")"; else want="$nsB $(cat "$W/hostB/rank.pub")"; fi
  test "$(cat "$W/where_$r")" = "$want" || { echo "rank $r: $(cat "$W/where_$r"), expected $want"; exit 1; }
done
test "$nsA" != "$nsB"
# ... each listening on its own host's address, given to the others (rank 0's address book line)
book=$(grep "troupe: 4 ranks:" "$W/log_run.txt")
echo "$book"
for r in 0 1 2 3; do
  echo "$book" | grep -q "$r [a-z0-9]* at tcp://$NET.$((r % 2 + 1)):[0-9]*" || { echo "rank $r is not at $NET.$((r % 2 + 1))"; exit 1; }
done

# no plaintext crossed: MARKER, a string of the env's messages, is on the wire of a run without
# CURVE (so the capture would see it) and nowhere in the CURVE run's
MARKER=arithmetic
captured 120 plain --set cluster.curve=false --set sft.max_steps=2 --set grpo.max_steps=1
wire_check plain present
wire_check run absent
rm -f "$W"/wire_*.bin

# host B with a key the authorized_keys file does not list: A refuses B's connections, the ranks
# see each other go silent and the run fails (bounded by the peer timeout, not by `timeout`)
t0=$(date +%s)
rc=0
export HOSTB_KEYS=$W/hostX
run 60 refused --set cluster.heartbeat_s=0.5 --set cluster.peer_timeout_s=3 || rc=$?
echo "unlisted key: mpirun exit $rc after $(( $(date +%s) - t0 )) s"
grep -v PMIX "$W/log_refused.txt" | grep "refused\|failed" | head -4 || true
test $rc != 0 && test $rc != 124 && test $rc != 137
grep -qF "refused a CURVE peer from $NET.2: key $(cat "$W/hostX/rank.pub") is not in $W/authorized_keys" "$W/log_refused.txt"
grep -q "peer rank [0-9] (role [a-z0-9]*) failed" "$W/log_refused.txt"

# one host's address as bind_host (the usual mistake with a config shared by hosts): host B's
# ranks stop at once, naming the value and B's own interfaces
export HOSTB_KEYS=$W/hostB
rc=0
run 60 foreign --set cluster.bind_host=$NET.1 || rc=$?
test $rc != 0 && test $rc != 124 && test $rc != 137
grep "cluster.bind_host" "$W/log_foreign.txt" | head -2
grep -q "troupe: error: runtime: rank [13] (role [a-z0-9]*): cluster.bind_host: '$NET.1' is not an address of this node (this node's interfaces: lo 127.0.0.1, tr0 $NET.2)" "$W/log_foreign.txt"
echo "e2e.multinode_netns ok"
