# launch.import_cli: `troupe import` on the tiny llama fixture writes a loadable directory (exit 0);
# a truncated file, a corrupt header, an unsupported architecture and a vocabulary size mismatch exit 2
# with a message naming the file and the reason.
set(work "${WORK}/troupe_import_cli")
file(REMOVE_RECURSE "${work}")
file(MAKE_DIRECTORY "${work}")

execute_process(COMMAND ${TROUPE} import ${FIXTURES}/tiny_llama.gguf ${work}/out --dtype bf16 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "troupe import of tiny_llama.gguf exited ${rc}: ${err}")
endif()
foreach(f config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json)
  if(NOT EXISTS ${work}/out/${f})
    message(FATAL_ERROR "troupe import wrote no ${f}")
  endif()
endforeach()
file(READ ${work}/out/config.json config)
if(NOT config MATCHES "\"torch_dtype\": \"bfloat16\"")
  message(FATAL_ERROR "--dtype bf16: config.json says ${config}")
endif()

# Bad inputs: a truncated copy, a corrupt header (bad magic), an unsupported file, a vocab mismatch.
execute_process(COMMAND head -c 20000 ${FIXTURES}/tiny_llama.gguf OUTPUT_FILE ${work}/truncated.gguf)
file(WRITE ${work}/corrupt.gguf "GGUG not a gguf file at all, only text")
foreach(case "truncated.gguf|${work}/truncated.gguf|runs past the end"
             "corrupt.gguf|${work}/corrupt.gguf|bad magic"
             "unsupported.gguf|${FIXTURES}/unsupported.gguf|is not supported"
             "badvocab|${FIXTURES}/tiny_llama_badvocab.gguf|vocabulary size mismatch"
             "missing|${work}/absent.gguf|cannot open")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 1 file)
  list(GET parts 2 reason)
  execute_process(COMMAND ${TROUPE} import ${file} ${work}/bad RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "troupe import ${file} must exit 2, got ${rc}: ${err}")
  endif()
  string(FIND "${err}" "${file}" at_file)
  string(FIND "${err}" "${reason}" at_reason)
  if(at_file EQUAL -1 OR at_reason EQUAL -1)
    message(FATAL_ERROR "troupe import ${file}: the message must name the file and say '${reason}': ${err}")
  endif()
endforeach()
execute_process(COMMAND ${TROUPE} import ${FIXTURES}/tiny_llama.gguf ${work}/x --dtype f8 RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "--dtype f8 must exit 2, got ${rc}")
endif()
file(REMOVE_RECURSE "${work}")
