#!/usr/bin/env bash
# envs.nemo_gym_run: tiny troupe runs (tests/reliability/tiny.yaml) whose env is a nemo_gym server
# that misbehaves on purpose (fake_nemo_gym_server.py): failed verifies are counted per reason and
# the run goes on below envs[].max_failure_frac, or stops (exit 3) naming the bound and the error;
# a server troupe starts from command: with cwd:, environment: and config.server_config, its output
# kept in the run's logs/; and YAML mistakes in nemo_gym / reasoning_gym entries are refused by
# troupe validate (exit 2).
#   nemo_gym_run.sh TROUPE PYTHON SOURCE_DIR WORK_DIR
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 WORK=$4
CHECK="$PY $SRC/tests/reliability/check.py"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
for i in $(seq 0 39); do
  echo "{\"responses_create_params\": {\"input\": \"say $((i % 10))\"}, \"answer\": \"$((i % 10))\", \"id\": $i}"
done > rows.jsonl
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done' EXIT
start_server() {  # start_server NAME ARGS...: sets URL
  rm -f "$WORK/$1.port"
  "$PY" "$SRC/tests/envs/fake_nemo_gym_server.py" --port-file "$WORK/$1.port" "${@:2}" &
  PIDS+=($!)
  for _ in $(seq 200); do [ -s "$WORK/$1.port" ] && break; sleep 0.05; done
  URL="http://127.0.0.1:$(cat "$WORK/$1.port")"
}
run() {  # run NAME CODE ARGS...
  local name=$1 want=$2 rc=0
  shift 2
  "$TROUPE" run "$SRC/tests/reliability/tiny.yaml" --set run.dir="$WORK/$name" --set envs[0].name=ng \
    --set envs[0].type=nemo_gym --set envs[0].path= --set envs[0].url="$URL" \
    --set "envs[0].config={\"data\": \"$WORK/rows.jsonl\", \"max_turns\": 1}" --set envs[0].max_retries=0 "$@" \
    2> "$WORK/$name.err" > "$WORK/$name.out" || rc=$?
  if [ "$rc" != "$want" ]; then
    tail -n 20 "$WORK/$name.out" "$WORK/$name.err"
    echo "run $name: expected exit $want, got $rc"
    exit 1
  fi
}
# every 5th verify answers 500: counted as env_error, the run finishes; eval asks /aggregate_metrics
start_server continue --fault http500 --every 5
run continue 0 --set envs[0].max_failure_frac=0.5
$CHECK steps "$WORK/continue" 2
$CHECK atleast "$WORK/continue" env_failures/env_error 2
grep -q '"reward_components/ng/found"' "$WORK/continue/metrics.jsonl"
grep -q '"eval_env/ng/mean/reward"' "$WORK/continue/metrics.jsonl"
# a single-turn episode keeps the /verify answer's extra fields in its turn's info.fields, as multi-turn does
"$PY" - "$WORK/continue" <<'PYEOF'
import glob, json, sys
ts = [json.loads(l) for p in glob.glob(sys.argv[1] + "/trajectories/*.jsonl") for l in open(p) if l.strip()]
ok = [t for t in ts if t["termination"] != "env_error"]
bad = [t["turns"][-1].get("info") for t in ok if "judge_score" not in t["turns"][-1].get("info", {}).get("fields", {})]
if not ok or bad:
    sys.exit(f"FAIL: single-turn trajectories without info.fields.judge_score: {len(bad)} of {len(ok)}, e.g. {bad[:1]}")
print("info.fields kept:", len(ok), "trajectories")
PYEOF
# every 4th verify answers after 2 s, past timeout_s 0.5: counted as timeout
start_server slow --fault slow --every 4
run slow 0 --set envs[0].timeout_s=0.5 --set envs[0].max_failure_frac=0.5
$CHECK atleast "$WORK/slow" env_failures/timeout 2
# every verify answers without a reward: protocol_error, all fail, the run stops (exit 3)
start_server schema --fault no_reward --every 1
run schema 3
grep -q "no numeric 'reward'" "$WORK/schema.err"
# every 2nd answer is not JSON, past max_failure_frac 0.3: exit 3 naming the bound
start_server frac --fault not_json --every 2
run frac 3 --set envs[0].max_failure_frac=0.3
grep -q "max_failure_frac 0.3" "$WORK/frac.err"
grep -q "protocol_error" "$WORK/frac.err"
# troupe starts the server (command:) in cwd: with environment: and config.server_config; the
# server's output stays in the run's logs/; an entry with url: and no type is a nemo_gym env
mkdir -p "$WORK/own/srv"
rc=0
"$TROUPE" run "$SRC/tests/reliability/tiny.yaml" --set run.dir="$WORK/own/run" --set envs[0].name=ng \
  --set envs[0].type=nemo_gym --set envs[0].path= \
  --set "envs[0].command=[\"$PY\", \"$SRC/tests/envs/fake_nemo_gym_server.py\", \"--port\", \"{port}\"]" \
  --set envs[0].cwd="$WORK/own/srv" --set 'envs[0].environment={"FAKE_MARK": "seen-42"}' \
  --set "envs[0].config={\"data\": \"$WORK/rows.jsonl\", \"max_turns\": 1, \"server_config\": {\"flavour\": \"plain\"}}" \
  > "$WORK/own.out" 2> "$WORK/own.err" || rc=$?
[ "$rc" = 0 ] || { tail -n 20 "$WORK/own.err"; echo "own server run: exit $rc"; exit 1; }
LOG=$(ls "$WORK"/own/run/logs/env-ng-*.log | head -1)
grep -qF "cwd=$WORK/own/srv FAKE_MARK=seen-42 server_config={\"flavour\":\"plain\"}" "$LOG" || { echo "server log $LOG:"; cat "$LOG"; exit 1; }
$CHECK steps "$WORK/own/run" 2
printf 'envs:\n  - name: ng\n    url: http://127.0.0.1:1\n    config: {data: rows.jsonl}\n' > "$WORK/inferred.yaml"
"$TROUPE" validate "$WORK/inferred.yaml" > /dev/null 2>&1 || { echo "an entry with url: and no type is not a nemo_gym env"; exit 1; }
# bad YAML is refused before anything starts (exit 2, FILE:LINE:COL naming the key)
printf 'envs:\n  - name: ng\n    type: nemo_gym\n    config: {data: rows.jsonl}\n' > "$WORK/no_url.yaml"
printf 'envs:\n  - name: rg\n    type: reasoning_gym\n' > "$WORK/no_task.yaml"
printf 'envs:\n  - name: arithmetic\n    type: builtin\n    url: http://127.0.0.1:1\n' > "$WORK/url_builtin.yaml"
printf 'rollout: {max_turns: 2}\nenvs:\n  - name: ng\n    type: nemo_gym\n    url: http://127.0.0.1:1\n    config: {data: rows.jsonl}\n' > "$WORK/turns.yaml"
for c in "no_url:envs\[0\].url: a nemo_gym env needs exactly one of url" "no_task:envs\[0\].config: a reasoning_gym env needs config.task" \
         "url_builtin:envs\[0\].url: url is only for type: nemo_gym" \
         "turns:envs\[0\].config: config.max_turns 8 is above rollout.max_turns 2"; do
  f=${c%%:*} want=${c#*:} rc=0
  "$TROUPE" validate "$WORK/$f.yaml" 2> "$WORK/$f.err" || rc=$?
  [ "$rc" = 2 ] || { echo "validate $f.yaml: exit $rc"; cat "$WORK/$f.err"; exit 1; }
  grep -q "$f.yaml:[0-9]*:[0-9]*: error: $want" "$WORK/$f.err" || { echo "validate $f.yaml:"; cat "$WORK/$f.err"; exit 1; }
done
echo "nemo_gym runs: ok"
