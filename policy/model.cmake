# Model, arenas, forward/backward, KV-cache inference. target_sources(troupe_policy PRIVATE ...) and tests here.
target_sources(troupe_policy PRIVATE ${CMAKE_CURRENT_LIST_DIR}/model.cpp)
if(TROUPE_BUILD_TESTS)
  # One binary, several ctest names (policy.*), each a gtest filter.
  troupe_add_test(NAME policy.model TARGET policy_model_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/model.test.cpp
                  LIBS troupe::policy ENV OMP_WAIT_POLICY=PASSIVE
                  ARGS --gtest_filter=Model.TableFollowsHuggingFaceNames:Model.DeterministicInit:Model.BadConfigAndBatchAreErrors:Model.PackedSequencesAreIndependent)
  troupe_add_test(NAME policy.model_gradcheck TARGET policy_model_test ARGS --gtest_filter=Model.FiniteDifferenceGradients ENV OMP_WAIT_POLICY=PASSIVE)
  troupe_add_test(NAME policy.packed_meta_cache TARGET policy_model_test ARGS --gtest_filter=Model.PackedMetaCache ENV OMP_WAIT_POLICY=PASSIVE)
  troupe_add_test(NAME policy.activation_checkpointing TARGET policy_model_test ARGS --gtest_filter=Model.ActivationCheckpointingMatches ENV OMP_WAIT_POLICY=PASSIVE)
  troupe_add_test(NAME policy.activation_offload TARGET policy_model_test ARGS --gtest_filter=Model.ActivationOffloadMatches ENV OMP_WAIT_POLICY=PASSIVE)
  troupe_add_test(NAME policy.moe_grouped TARGET policy_model_test ARGS --gtest_filter=Model.MoeGroupedMatchesMasked ENV OMP_WAIT_POLICY=PASSIVE)
  troupe_add_test(NAME policy.kv_cache_logprobs TARGET policy_model_test ARGS --gtest_filter=Model.KvCacheLogprobsMatchForward:Model.SamplingIsSeededAndStops ENV OMP_WAIT_POLICY=PASSIVE)
endif()
