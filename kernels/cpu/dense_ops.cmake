# Dense transformer ops (matmul, embedding, norms, RoPE, attention, SwiGLU, log-prob, residual add,
# KV-cache write, packed layout) and their op test registry.
target_sources(troupe_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ops.cpp)
if(TROUPE_BUILD_TESTS)
  # The op registry: backward vs central finite differences (fp64) and fp32 vs fp64, every dense op.
  troupe_add_test(NAME kernels.ops_gradcheck SOURCES ${CMAKE_CURRENT_LIST_DIR}/ops.test.cpp
                  LIBS troupe::kernels OWN_MAIN ARGS all)
endif()
