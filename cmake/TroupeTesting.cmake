# Test helpers. ctest names are folder.thing[.case]; labels name the folder plus gpu/mpi/slow.
#   troupe_add_test(NAME runtime.mailbox SOURCES mailbox.test.cpp LIBS troupe::runtime [LABELS slow] [TIMEOUT s]
#                   [ARGS ...] [ENV VAR=value ...]
#                   [GROUP runtime.other "Suite.Case*:Suite.Other"]...)
#     Every TEST of the file runs under ctest: with GROUPs, each group is a ctest of its own (a gtest
#     filter, ':'-separated) and NAME runs every test that no group names, so a new TEST is never
#     left out. Without GROUPs, NAME runs the whole file.
#   troupe_add_mpi_test(NAME runtime.mpi_pingpong NP 4 COMMAND $<TARGET_FILE:x> args... [LABELS ...])
#   troupe_add_gpu_test(...) same as troupe_add_test, adds label gpu; the binary exits 77 when no GPU.
#   OWN_MAIN: the test defines main() itself (e.g. to exit 77 = skipped); its ARGS are passed as is.
#   TARGET: the executable's name (default: NAME with '.' -> '_', plus _test).
# Every *.test.cpp in the source tree must be the SOURCES of some troupe_add_test:
# troupe_check_test_sources() (called last by the top-level CMakeLists.txt) fails the configure
# step naming any file that is not, so a test file cannot silently never run.
set(TROUPE_TEST_SKIP_CODE 77)

function(_troupe_folder_label name out)
  string(REPLACE "." ";" parts ${name})
  list(GET parts 0 folder)
  set(${out} ${folder} PARENT_SCOPE)
endfunction()

# One ctest entry with troupe's standard properties.
function(_troupe_register_test name target timeout labels env)
  add_test(NAME ${name} COMMAND ${target} ${ARGN})
  _troupe_folder_label(${name} folder)
  # Passive OpenMP waits: spinning workers starve everything else on 2 shared cores.
  set_tests_properties(${name} PROPERTIES LABELS "${folder};${labels}" TIMEOUT ${timeout}
                       SKIP_RETURN_CODE ${TROUPE_TEST_SKIP_CODE} ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE;${env}")
endfunction()

function(troupe_add_test)
  cmake_parse_arguments(T "OWN_MAIN" "NAME;TIMEOUT;TARGET" "SOURCES;LIBS;LABELS;ARGS;ENV;GROUP" ${ARGN})
  if(T_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "troupe_add_test(${T_NAME}): unknown arguments ${T_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT T_SOURCES)
    message(FATAL_ERROR "troupe_add_test(${T_NAME}): SOURCES is required (one test file, one call)")
  endif()
  if(NOT T_TARGET)
    string(REPLACE "." "_" T_TARGET "${T_NAME}_test")
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_TARGET} ${T_SOURCES})
  target_link_libraries(${T_TARGET} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock troupe::warnings)
  if(NOT T_OWN_MAIN)
    target_link_libraries(${T_TARGET} PRIVATE GTest::gtest_main)
  endif()
  foreach(src ${T_SOURCES})
    get_filename_component(abs ${src} ABSOLUTE)
    set_property(GLOBAL APPEND PROPERTY TROUPE_REGISTERED_TEST_SOURCES ${abs})
  endforeach()

  list(LENGTH T_GROUP n)
  math(EXPR odd "${n} % 2")
  if(odd)
    message(FATAL_ERROR "troupe_add_test(${T_NAME}): GROUP takes a name and a gtest filter")
  endif()
  if(n EQUAL 0)
    _troupe_register_test(${T_NAME} ${T_TARGET} ${T_TIMEOUT} "${T_LABELS}" "${T_ENV}" ${T_ARGS})
    return()
  endif()
  if(T_OWN_MAIN)
    message(FATAL_ERROR "troupe_add_test(${T_NAME}): GROUP needs gtest's main (filters)")
  endif()
  set(named "")
  math(EXPR last "${n} - 1")
  foreach(i RANGE 0 ${last} 2)
    math(EXPR j "${i} + 1")
    list(GET T_GROUP ${i} group_name)
    list(GET T_GROUP ${j} group_filter)
    _troupe_register_test(${group_name} ${T_TARGET} ${T_TIMEOUT} "${T_LABELS}" "${T_ENV}" ${T_ARGS}
                          --gtest_filter=${group_filter})
    if(named)
      string(APPEND named ":${group_filter}")
    else()
      set(named "${group_filter}")
    endif()
  endforeach()
  # The rest of the file: every test no group names (none is an empty, passing run).
  _troupe_register_test(${T_NAME} ${T_TARGET} ${T_TIMEOUT} "${T_LABELS}" "${T_ENV}" ${T_ARGS} --gtest_filter=-${named})
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

# Fails the configure step if a *.test.cpp under the source tree is registered by no troupe_add_test.
function(troupe_check_test_sources)
  file(GLOB_RECURSE all_tests LIST_DIRECTORIES false RELATIVE ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/*.test.cpp)
  get_property(registered GLOBAL PROPERTY TROUPE_REGISTERED_TEST_SOURCES)
  set(missing "")
  foreach(rel ${all_tests})
    if(rel MATCHES "^(build[^/]*|\\.[^/]*)/")  # build trees and hidden folders (.venv, .git)
      continue()
    endif()
    if(NOT "${CMAKE_SOURCE_DIR}/${rel}" IN_LIST registered)
      list(APPEND missing ${rel})
    endif()
  endforeach()
  if(missing)
    string(REPLACE ";" "\n  " missing_lines "${missing}")
    message(FATAL_ERROR "These test files are registered by no troupe_add_test(), so ctest would never run them:\n  ${missing_lines}")
  endif()
endfunction()
