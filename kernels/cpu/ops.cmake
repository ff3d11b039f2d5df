# Dense transformer ops (owned by the policy-model work). target_sources(troupe_kernels PRIVATE ...) and tests here.
target_sources(troupe_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ops.cpp)
if(TROUPE_BUILD_TESTS)
  # The op registry: backward vs central finite differences (fp64) and fp32 vs fp64, every dense op.
  troupe_add_test(NAME kernels.ops_gradcheck SOURCES ${CMAKE_CURRENT_LIST_DIR}/ops.test.cpp
                  LIBS troupe::kernels OWN_MAIN ARGS all)
endif()
