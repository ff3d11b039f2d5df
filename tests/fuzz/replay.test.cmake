# tests.fuzz_replay: runs every fuzz target's replay binary over corpus/<target>/ and
# regressions/<target>/. REPLAYS = "target=binary|...", DIR = tests/fuzz. Fails naming the target
# whose replay failed, or a target with no corpus at all.
string(REPLACE "|" ";" replays "${REPLAYS}")
foreach(entry ${replays})
  string(REPLACE "=" ";" parts "${entry}")
  list(GET parts 0 target)
  list(GET parts 1 binary)
  if(NOT IS_DIRECTORY ${DIR}/corpus/${target})
    message(FATAL_ERROR "fuzz target ${target} has no seed corpus (${DIR}/corpus/${target})")
  endif()
  execute_process(COMMAND ${binary} ${DIR}/corpus/${target} ${DIR}/regressions/${target}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fuzz replay of ${target} failed (${rc}):\n${out}\n${err}")
  endif()
  string(STRIP "${out}" out)
  message(STATUS "${target}: ${out}")
endforeach()
