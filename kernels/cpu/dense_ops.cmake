# Dense transformer ops (matmul, embedding, norms, RoPE, attention, SwiGLU, log-prob, residual add,
# KV-cache write, packed layout) and their op test registry.
target_sources(troupe_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ops.cpp ${CMAKE_CURRENT_LIST_DIR}/small_gemm.cpp
                                     ${CMAKE_CURRENT_LIST_DIR}/lora.cpp)
if(TROUPE_BUILD_TESTS)
  # The op registry: backward vs central finite differences (fp64) and fp32 vs fp64, every dense op.
  troupe_add_test(NAME kernels.ops_gradcheck SOURCES ${CMAKE_CURRENT_LIST_DIR}/ops.test.cpp
                  LIBS troupe::kernels OWN_MAIN ARGS all)
  # Few-row GEMMs against a wide operand (column blocks, the row-times-row kernel): bits on 1-3 threads.
  troupe_add_test(NAME kernels.small_gemm SOURCES ${CMAKE_CURRENT_LIST_DIR}/small_gemm.test.cpp
                  LIBS troupe::kernels)
  # LoRA's ops: finite differences, fp32 vs fp64, the dX-only matmul backward against the full one.
  troupe_add_test(NAME kernels.lora SOURCES ${CMAKE_CURRENT_LIST_DIR}/lora.test.cpp LIBS troupe::kernels
                  ENV OMP_WAIT_POLICY=PASSIVE)
endif()
