# The MoE layer (grouped routing and the masked loop) and the activation offload copy engine, with their tests.
target_sources(troupe_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/moe.cpp)
target_sources(troupe_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/offload.cpp)
if(TROUPE_BUILD_TESTS)
  # One binary, several ctest names (kernels.moe_*), each a gtest filter; kernels.moe runs the rest.
  troupe_add_test(NAME kernels.moe TARGET kernels_moe_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/moe.test.cpp LIBS troupe::kernels
    GROUP kernels.moe_grouped_vs_masked
          "Moe.GroupedEqualsMasked*:Moe.DispatchGroupedEqualsMasked*:Moe.EmptyExperts:Moe.AllTokensOnOneExpert:Moe.StreamBytes*"
    GROUP kernels.moe_routing "Moe.EachTokenReachesItsTopK:Moe.TopKTiesGoToLowerIndex:Moe.ZeroTokens:Moe.ThreadCountDoesNotChangeBits"
    GROUP kernels.moe_permute_roundtrip "Moe.PermuteUnpermuteRoundTrip"
    GROUP kernels.moe_gradcheck "Moe.FiniteDifferenceGradient")
  troupe_add_test(NAME kernels.offload TARGET kernels_offload_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/offload.test.cpp
    LIBS troupe::kernels GROUP kernels.offload_copy_engine "CopyEngine.*" GROUP kernels.offload_protocol "Offload.*")
endif()
