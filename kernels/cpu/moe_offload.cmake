# The MoE layer (grouped routing and the masked loop) and the activation offload copy engine, with their tests.
target_sources(troupe_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/moe.cpp)
target_sources(troupe_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/offload.cpp)
if(TROUPE_BUILD_TESTS)
  # One binary, several ctest names (kernels.moe_*), each a gtest filter.
  troupe_add_test(NAME kernels.moe_grouped_vs_masked TARGET kernels_moe_test
                  SOURCES ${CMAKE_CURRENT_LIST_DIR}/moe.test.cpp LIBS troupe::kernels
                  ARGS --gtest_filter=Moe.GroupedEqualsMasked*:Moe.DispatchGroupedEqualsMasked*:Moe.EmptyExperts:Moe.AllTokensOnOneExpert:Moe.StreamBytes* ENV OMP_WAIT_POLICY=PASSIVE)
  troupe_add_test(NAME kernels.moe_routing TARGET kernels_moe_test
                  ARGS --gtest_filter=Moe.EachTokenReachesItsTopK:Moe.TopKTiesGoToLowerIndex:Moe.ZeroTokens:Moe.ThreadCountDoesNotChangeBits ENV OMP_WAIT_POLICY=PASSIVE)
  troupe_add_test(NAME kernels.moe_permute_roundtrip TARGET kernels_moe_test ARGS --gtest_filter=Moe.PermuteUnpermuteRoundTrip ENV OMP_WAIT_POLICY=PASSIVE)
  troupe_add_test(NAME kernels.moe_gradcheck TARGET kernels_moe_test ARGS --gtest_filter=Moe.FiniteDifferenceGradient ENV OMP_WAIT_POLICY=PASSIVE)
endif()
if(TROUPE_BUILD_TESTS)
  troupe_add_test(NAME kernels.offload_copy_engine TARGET kernels_offload_test
                  SOURCES ${CMAKE_CURRENT_LIST_DIR}/offload.test.cpp LIBS troupe::kernels ARGS --gtest_filter=CopyEngine.* ENV OMP_WAIT_POLICY=PASSIVE)
  troupe_add_test(NAME kernels.offload_protocol TARGET kernels_offload_test ARGS --gtest_filter=Offload.* ENV OMP_WAIT_POLICY=PASSIVE)
endif()
