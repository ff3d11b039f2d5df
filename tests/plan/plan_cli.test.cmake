# launch.plan_cli: `troupe plan` prints the table and --json for a tiny config and a published shape,
# a bad --device-memory / --shard is exit 2 naming the value, and `troupe validate` / `troupe run`
# refuse a config over learner.memory_budget (exit 2) with the table and the role and rank.
set(dir ${WORK}/plan_cli)
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
file(WRITE ${dir}/tiny.yaml "run:\n  dir: ${dir}/run\nenvs:\n  - name: arithmetic\ngrpo:\n  max_steps: 1\n")
function(expect_rc want)
  execute_process(COMMAND ${TROUPE} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL ${want})
    message(FATAL_ERROR "troupe ${ARGN}: exit ${rc}, expected ${want}\nstdout: ${out}\nstderr: ${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

expect_rc(0 plan ${dir}/tiny.yaml)
foreach(want "memory plan of .*tiny.yaml on cpu" "learner 0 \\(0\\)" "generator 0 \\(1\\)" "env_worker 0 \\(2\\)"
             "coordinator 0 \\(0\\)" "weights +grads +optimizer +activations +kv cache" "one process")
  if(NOT out MATCHES "${want}")
    message(FATAL_ERROR "troupe plan: no '${want}' in\n${out}")
  endif()
endforeach()

expect_rc(0 plan ${dir}/tiny.yaml --json --device-memory 1GiB)
string(JSON fits GET "${out}" fits)
string(JSON dev GET "${out}" rows 0 device_bytes)
string(JSON role GET "${out}" rows 0 role)
string(JSON cap GET "${out}" capacity_bytes)
if(NOT fits OR NOT role STREQUAL "learner" OR dev LESS_EQUAL 0 OR NOT cap EQUAL 1073741824)
  message(FATAL_ERROR "troupe plan --json: fits=${fits} role=${role} device_bytes=${dev} capacity=${cap}\n${out}")
endif()

# Qwen3-8B on 8 learners sharded by parameters, on cpu (config.json only): learner 0 keeps the whole
# weights between steps and the weight-sync buffers, 109 GiB
expect_rc(0 plan ${dir}/tiny.yaml --set policy.path=${PLAN_DIR}/models/qwen3-8b --set policy.tokenizer=byte
          --set policy.activation_checkpointing=true --learners 8 --shard parameters --device-memory 120GiB)
if(NOT out MATCHES "8190735360 parameters" OR NOT out MATCHES "learner 7 \\(7\\)" OR NOT out MATCHES "fits --device-memory 120 GiB")
  message(FATAL_ERROR "troupe plan qwen3-8b:\n${out}")
endif()

expect_rc(2 plan ${dir}/tiny.yaml --device-memory 80gigs)
if(NOT err MATCHES "troupe: error: --device-memory: \"80gigs\" is not a memory size")
  message(FATAL_ERROR "bad --device-memory: ${err}")
endif()
expect_rc(2 plan ${dir}/tiny.yaml --shard zero3)
if(NOT err MATCHES "--shard: \"zero3\" is not a stage")
  message(FATAL_ERROR "bad --shard: ${err}")
endif()
expect_rc(2 plan ${dir}/tiny.yaml --device-memory 1MiB)
if(NOT out MATCHES "does not fit: learner 0 \\(rank 0\\) needs")
  message(FATAL_ERROR "plan over --device-memory:\n${out}")
endif()

# learner.memory_budget: validate and run refuse before anything starts, naming the rank
foreach(cmd validate run)
  expect_rc(2 ${cmd} ${dir}/tiny.yaml --set learner.memory_budget=1MiB)
  if(NOT err MATCHES "tiny.yaml: error: the memory plan does not fit: learner 0 \\(rank 0\\) needs [0-9.]+ [KMG]iB on cpu, [0-9.]+ [KMG]iB over learner.memory_budget 1.00 MiB"
     OR NOT err MATCHES "learner 0 \\(0\\)")
    message(FATAL_ERROR "${cmd} over budget: ${err}")
  endif()
endforeach()
if(EXISTS ${dir}/run/metrics.jsonl)
  message(FATAL_ERROR "a refused run wrote ${dir}/run")
endif()
expect_rc(0 validate ${dir}/tiny.yaml --set learner.memory_budget=64GiB)
expect_rc(2 validate ${dir}/tiny.yaml --set learner.memory_budget=lots)
if(NOT err MATCHES "learner.memory_budget: \"lots\" is not a memory size")
  message(FATAL_ERROR "validate bad budget: ${err}")
endif()
