# Third-party dependencies, all from Debian packages (see scripts/setup.sh for the list; GoogleTest
# and Google Benchmark only with tests: setup.sh --test).
find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(cppzmq REQUIRED)          # brings libzmq
find_package(cereal REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(TROUPE_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas openblas-pthread REQUIRED)
if(TROUPE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
find_package(benchmark QUIET)

# The Python troupe runs for PyTorch baselines, golden scripts and the Python SDK; recorded here,
# overridable at run time with TROUPE_PYTHON.
if(NOT TROUPE_PYTHON)
  if(EXISTS ${CMAKE_SOURCE_DIR}/.venv/bin/python)
    set(TROUPE_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python CACHE FILEPATH "" FORCE)
  else()
    set(TROUPE_PYTHON /usr/bin/python3 CACHE FILEPATH "" FORCE)
  endif()
endif()
message(STATUS "troupe: Python for baselines and SDK: ${TROUPE_PYTHON}")
message(STATUS "troupe: CUDA ${TROUPE_CUDA}, MPI ${MPI_CXX_VERSION}, BLAS ${BLAS_LIBRARIES}")
