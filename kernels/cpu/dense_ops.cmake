# Dense transformer ops (matmul, embedding, norms, RoPE, attention, SwiGLU, log-prob, residual add,
# KV-cache write, packed layout) and their op test registry.
target_sources(troupe_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ops.cpp ${CMAKE_CURRENT_LIST_DIR}/small_gemm.cpp
                                     ${CMAKE_CURRENT_LIST_DIR}/lora.cpp ${CMAKE_CURRENT_LIST_DIR}/bf16_weights.cpp)
# Frozen weights in ggml blocks and the GEMMs that dequantize them on the fly. Their values must be
# ggml's (a multiply, then an add, each rounded), so the compiler may not fuse them into an FMA.
target_sources(troupe_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/quant_matrix.cpp ${CMAKE_CURRENT_LIST_DIR}/quant_matmul.cpp)
# The decode steps' thread pool (spins a bounded time between jobs, then blocks).
target_sources(troupe_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/decode_pool.cpp)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/quant_matrix.cpp ${CMAKE_CURRENT_LIST_DIR}/quant_matmul.cpp
                            PROPERTIES COMPILE_OPTIONS -ffp-contract=off)
if(TROUPE_BUILD_TESTS)
  # The op registry: backward vs central finite differences (fp64) and fp32 vs fp64, every dense op.
  troupe_add_test(NAME kernels.ops_gradcheck SOURCES ${CMAKE_CURRENT_LIST_DIR}/ops.test.cpp
                  LIBS troupe::kernels OWN_MAIN ARGS all)
  # Few-row GEMMs against a wide operand (column blocks, the row-times-row kernel): bits on 1-3 threads.
  # Quantized weights: formats, quantize/dequantize, the quant ops against matmul on the dequantized
  # values (bit for bit where the blocks of work agree), finite differences, the backends.
  troupe_add_test(NAME kernels.quant_matmul SOURCES ${CMAKE_CURRENT_LIST_DIR}/quant_matmul.test.cpp
                  LIBS troupe::kernels ENV OMP_WAIT_POLICY=PASSIVE)
  # The bf16 GEMM of frozen weights (a scorer's distill.teacher_dtype: bf16): against the rounded
  # inputs' product, bits on 1 and 2 threads and for a row alone, the scope (skipped without AVX512-BF16).
  troupe_add_test(NAME kernels.bf16_weights SOURCES ${CMAKE_CURRENT_LIST_DIR}/bf16_weights.test.cpp
                  LIBS troupe::kernels OpenMP::OpenMP_CXX ENV OMP_WAIT_POLICY=PASSIVE)
  # The decode pool on its own (its source, no other library: the TSan build runs it cheaply).
  troupe_add_test(NAME kernels.decode_pool SOURCES ${CMAKE_CURRENT_LIST_DIR}/decode_pool.test.cpp
                  ${CMAKE_CURRENT_LIST_DIR}/decode_pool.cpp LIBS Threads::Threads)
  troupe_add_test(NAME kernels.small_gemm SOURCES ${CMAKE_CURRENT_LIST_DIR}/small_gemm.test.cpp
                  LIBS troupe::kernels)
  # LoRA's ops: finite differences, fp32 vs fp64, the dX-only matmul backward against the full one.
  troupe_add_test(NAME kernels.lora SOURCES ${CMAKE_CURRENT_LIST_DIR}/lora.test.cpp LIBS troupe::kernels
                  ENV OMP_WAIT_POLICY=PASSIVE)
endif()
