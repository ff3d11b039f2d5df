# envs.python_sdk.pip_install: the SDK installs with pip and imports from the install location.
file(REMOVE_RECURSE ${WORK})
file(COPY ${SRC}/ DESTINATION ${WORK}/src PATTERN build EXCLUDE PATTERN "*.egg-info" EXCLUDE PATTERN __pycache__ EXCLUDE)
execute_process(COMMAND ${PYTHON} -m pip install -q --no-deps --no-build-isolation --target ${WORK}/site ${WORK}/src
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pip install ./envs/python failed (${rc}): ${out} ${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${WORK}/site
                ${PYTHON} -c "import troupe_env, sys; assert troupe_env.__file__.startswith('${WORK}/site'), troupe_env.__file__; print(troupe_env.PROTOCOL)"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "troupe.env/1")
  message(FATAL_ERROR "installed troupe_env does not import: ${out} ${err}")
endif()
