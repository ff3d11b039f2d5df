# Test helpers. ctest names are folder.thing[.case]; labels name the folder plus gpu/mpi/slow.
#   troupe_add_test(NAME runtime.mailbox SOURCES mailbox.test.cpp LIBS troupe::runtime [LABELS slow] [ARGS ...] [TIMEOUT s])
#   troupe_add_mpi_test(NAME runtime.mpi_pingpong NP 4 COMMAND $<TARGET_FILE:x> args... [LABELS ...])
#   troupe_add_gpu_test(...) same as troupe_add_test, adds label gpu; the binary exits 77 when no GPU.
#   OWN_MAIN: the test defines main() itself (e.g. to exit 77 = skipped).
set(TROUPE_TEST_SKIP_CODE 77)

function(_troupe_folder_label name out)
  string(REPLACE "." ";" parts ${name})
  list(GET parts 0 folder)
  set(${out} ${folder} PARENT_SCOPE)
endfunction()

function(troupe_add_test)
  cmake_parse_arguments(T "OWN_MAIN" "NAME;TIMEOUT;TARGET" "SOURCES;LIBS;LABELS;ARGS;ENV" ${ARGN})
  if(NOT T_TARGET)
    string(REPLACE "." "_" T_TARGET "${T_NAME}_test")
  endif()
  if(T_SOURCES)
    add_executable(${T_TARGET} ${T_SOURCES})
    target_link_libraries(${T_TARGET} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock troupe::warnings)
    if(NOT T_OWN_MAIN)
      target_link_libraries(${T_TARGET} PRIVATE GTest::gtest_main)
    endif()
  endif()
  add_test(NAME ${T_NAME} COMMAND ${T_TARGET} ${T_ARGS})
  _troupe_folder_label(${T_NAME} folder)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${folder};${T_LABELS}" TIMEOUT ${T_TIMEOUT}
                       SKIP_RETURN_CODE ${TROUPE_TEST_SKIP_CODE})
  # Passive OpenMP waits: spinning workers starve everything else on 2 shared cores.
  set_tests_properties(${T_NAME} PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE;${T_ENV}")
endfunction()

function(troupe_add_gpu_test)
  cmake_parse_arguments(T "" "NAME" "LABELS" ${ARGN})
  troupe_add_test(NAME ${T_NAME} OWN_MAIN LABELS gpu ${T_LABELS} ${T_UNPARSED_ARGUMENTS})
endfunction()

# An mpirun test: RUN_SERIAL (busy-polling ranks starve each other on 2 cores), root-safe, oversubscribed.
function(troupe_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;NP;TIMEOUT" "COMMAND;LABELS;ENV" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_test(NAME ${T_NAME} COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} ${T_NP}
           --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo ${T_COMMAND})
  _troupe_folder_label(${T_NAME} folder)
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${folder};mpi;${T_LABELS}" RUN_SERIAL TRUE
    TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE ${TROUPE_TEST_SKIP_CODE}
    ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;${T_ENV}")
endfunction()
