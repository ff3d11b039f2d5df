#!/usr/bin/env bash
# envs.pool_run: a tiny troupe run (tests/reliability/tiny.yaml) whose env is a pool of three
# running SDK servers (pool_env.py) on 127.0.0.1; one kills itself on its 8th reset, mid-run, and
# is started again on its address. The run finishes every step with a full batch, each trained
# episode in the trajectory log once, the lost member's episodes retried (env_retries) and none
# failed, the member's loss and return logged and the restarted server used again. Then YAML
# mistakes in `addresses:` are refused by troupe validate (exit 2, FILE:LINE:COL).
#   pool_run.sh TROUPE PYTHON SOURCE_DIR WORK_DIR
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 WORK=$4
CHECK="$PY $SRC/tests/reliability/check.py"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
WATCH=
stop_all() {  # the watcher first (it would start b again), then every server
  [ -z "$WATCH" ] || kill "$WATCH" 2> /dev/null || true
  [ -z "$WATCH" ] || wait "$WATCH" 2> /dev/null || true
  for f in "$WORK"/*.pid; do kill -9 "$(cat "$f")" 2> /dev/null || true; done
}
trap stop_all EXIT
port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
serve() {  # serve NAME PORT ARGS...: its pid in NAME.pid
  "$PY" "$SRC/tests/envs/pool_env.py" --bind "tcp://127.0.0.1:$2" --log "$WORK/$1.seeds" "${@:3}" 2>> "$WORK/$1.log" &
  echo $! > "$WORK/$1.pid"
}
PA=$(port) PB=$(port) PC=$(port)
# each reset takes 0.1 s, so the run lasts long enough for b to come back (probed every second)
serve a "$PA" --delay 0.1
serve b "$PB" --delay 0.1 --die-after 8
serve c "$PC" --delay 0.1
# b dies by itself; start it again on its address at once (the pool probes it back in)
alive() { kill -0 "$1" 2> /dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2> /dev/null; }
( B=$(cat "$WORK/b.pid"); while alive "$B"; do sleep 0.05; done; serve b2 "$PB" --delay 0.1 ) &
WATCH=$!
ADDRS="[tcp://127.0.0.1:$PA, tcp://127.0.0.1:$PB, tcp://127.0.0.1:$PC]"
rc=0
"$TROUPE" run "$SRC/tests/reliability/tiny.yaml" --set run.dir="$WORK/run" --set envs[0].name=sums \
  --set envs[0].type=remote --set envs[0].path= --set "envs[0].addresses=$ADDRS" --set envs[0].timeout_s=2 \
  --set grpo.max_steps=8 > "$WORK/run.out" 2> "$WORK/run.err" || rc=$?
[ "$rc" = 0 ] || { tail -n 30 "$WORK/run.err"; echo "pool run: exit $rc"; exit 1; }
$CHECK steps "$WORK/run" 8
$CHECK atleast "$WORK/run" env_retries 1
for reason in timeout worker_crash env_error; do $CHECK none "$WORK/run" "env_failures/$reason"; done
"$PY" - "$WORK/run" <<'PYEOF'
import glob, json, sys
ts = [json.loads(l) for p in glob.glob(sys.argv[1] + "/trajectories/*.jsonl") for l in open(p) if l.strip()]
keys = [(t["step"], t["extra"]["prompt_index"], t["extra"]["sample"]) for t in ts]
if len(keys) != len(set(keys)):
    sys.exit(f"FAIL: {len(keys) - len(set(keys))} episodes trained twice")
for step in range(1, 9):
    n = sum(1 for k in keys if k[0] == step)
    if n != 32:
        sys.exit(f"FAIL: step {step} trained {n} episodes, expected 32 (8 prompts x 4)")
bad = [t for t in ts if t.get("error")]
if bad:
    sys.exit(f"FAIL: {len(bad)} trained episodes failed ({bad[0]['termination']}: {bad[0]['error']})")
print("each of", len(keys), "episodes trained once")
PYEOF
grep -q "pool member tcp://127.0.0.1:$PB is out of the pool" "$WORK/run.err" || { tail -n 30 "$WORK/run.err"; echo "no log of the lost member"; exit 1; }
grep -q "pool member tcp://127.0.0.1:$PB answers again: back in the pool" "$WORK/run.err" || { tail -n 30 "$WORK/run.err"; echo "the restarted member was not taken back"; exit 1; }
[ -s "$WORK/b2.seeds" ] || { echo "the restarted member got no episode"; exit 1; }
for m in a c; do [ -s "$WORK/$m.seeds" ] || { echo "member $m got no episode"; exit 1; }; done
echo "resets served: a $(wc -l < a.seeds), b $(wc -l < b.seeds) (then killed), b again $(wc -l < b2.seeds), c $(wc -l < c.seeds)"
# bad YAML is refused before anything starts (exit 2, FILE:LINE:COL naming the key)
printf 'envs:\n  - name: p\n    addresses: []\n' > "$WORK/empty.yaml"
printf 'envs:\n  - name: p\n    address: tcp://127.0.0.1:5000\n    addresses: [tcp://127.0.0.1:5001]\n' > "$WORK/both.yaml"
printf 'envs:\n  - name: p\n    addresses: [tcp://127.0.0.1:5000, "127.0.0.1:5001"]\n' > "$WORK/bad.yaml"
printf 'envs:\n  - name: p\n    addresses: [tcp://127.0.0.1:5000, tcp://127.0.0.1:5000]\n' > "$WORK/twice.yaml"
printf 'envs:\n  - name: arithmetic\n    type: builtin\n    addresses: [tcp://127.0.0.1:5000]\n' > "$WORK/builtin.yaml"
printf 'envs:\n  - name: ng\n    type: nemo_gym\n    addresses: [tcp://127.0.0.1:5000]\n    config: {data: rows.jsonl}\n' > "$WORK/nemo.yaml"
for c in "empty:3:.*envs\[0\].addresses: an empty pool" "both:4:.*envs\[0\].addresses: a pool (addresses:) goes without address:" \
         "bad:3:.*envs\[0\].addresses\[1\]: '127.0.0.1:5001' is not an env server's address (tcp://HOST:PORT or ipc://PATH)" \
         "twice:3:.*envs\[0\].addresses\[1\]: 'tcp://127.0.0.1:5000' is listed twice" \
         "builtin:4:.*envs\[0\].addresses: addresses: is only for type remote, nemo_gym or verifiers" \
         "nemo:4:.*envs\[0\].addresses\[0\]: 'tcp://127.0.0.1:5000' is not a resource server's address (http://HOST:PORT)"; do
  f=${c%%:*} rest=${c#*:} line=${rest%%:*} want=${rest#*:} rc=0
  "$TROUPE" validate "$WORK/$f.yaml" 2> "$WORK/$f.err" > /dev/null || rc=$?
  [ "$rc" = 2 ] || { echo "validate $f.yaml: exit $rc"; cat "$WORK/$f.err"; exit 1; }
  grep -q "$f.yaml:$line:[0-9]*: error: $want" "$WORK/$f.err" || { echo "validate $f.yaml:"; cat "$WORK/$f.err"; exit 1; }
done
echo "env pool runs: ok"
