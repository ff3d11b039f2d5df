# Model, arenas, forward/backward, KV-cache inference (decode_slots.cpp, the one decode loop, which
# generate.cpp drives for Model::generate). target_sources(troupe_policy PRIVATE ...) and tests here.
target_sources(troupe_policy PRIVATE ${CMAKE_CURRENT_LIST_DIR}/model.cpp ${CMAKE_CURRENT_LIST_DIR}/expert_blocks.cpp ${CMAKE_CURRENT_LIST_DIR}/lora.cpp ${CMAKE_CURRENT_LIST_DIR}/served_adapters.cpp
                                     ${CMAKE_CURRENT_LIST_DIR}/quant_base.cpp
                                     ${CMAKE_CURRENT_LIST_DIR}/decode_slots.cpp
                                     ${CMAKE_CURRENT_LIST_DIR}/generate.cpp ${CMAKE_CURRENT_LIST_DIR}/reward_model.cpp
                                     ${CMAKE_CURRENT_LIST_DIR}/memory_footprint.cpp)
if(TROUPE_BUILD_TESTS)
  # One binary, several ctest names (policy.*), each a gtest filter; policy.model runs the rest.
  troupe_add_test(NAME policy.model TARGET policy_model_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/model.test.cpp LIBS troupe::policy
    GROUP policy.model_gradcheck "Model.FiniteDifferenceGradients"
    GROUP policy.packed_meta_cache "Model.PackedMetaCache"
    GROUP policy.activation_checkpointing "Model.ActivationCheckpointingMatches"
    GROUP policy.activation_offload "Model.ActivationOffloadMatches"
    GROUP policy.moe_grouped "Model.MoeGroupedMatchesMasked"
    GROUP policy.kv_cache_logprobs "Model.KvCacheLogprobsMatchForward:Model.SamplingIsSeededAndStops"
    GROUP policy.routing_record "Model.RoutingRecordMatchesForward"
    GROUP policy.chunked_logprobs "Model.ChunkedLogprobsMatchWholeVocabulary:Model.ChunkedSamplingMatchesWholeVocabulary:Model.FusedHead*"
    GROUP policy.routing_replay "Model.RoutingReplay*"
    GROUP policy.batch_invariant "Model.BatchInvariant*")
endif()
if(TROUPE_BUILD_TESTS)
  # QLoRA: the quantized base against its dequantized fp32 twin, GGUF blocks loaded straight.
  troupe_add_test(NAME policy.qlora SOURCES ${CMAKE_CURRENT_LIST_DIR}/qlora.test.cpp LIBS troupe::policy
    ENV "TROUPE_GGUF_FIXTURES=${PROJECT_SOURCE_DIR}/tests/gguf" OMP_WAIT_POLICY=PASSIVE)
endif()
if(TROUPE_BUILD_TESTS)
  troupe_add_test(NAME policy.decode_slots SOURCES ${CMAKE_CURRENT_LIST_DIR}/decode_slots.test.cpp LIBS troupe::policy)
  # When a decode step is a recorded graph (host decisions), and the CPU backends ignoring the switch.
  troupe_add_test(NAME policy.decode_graph SOURCES ${CMAKE_CURRENT_LIST_DIR}/decode_graph.test.cpp LIBS troupe::policy)
  target_include_directories(policy_decode_graph_test PRIVATE ${CMAKE_CURRENT_LIST_DIR})
endif()
if(TROUPE_BUILD_TESTS)
  # The model's device path (host mirror, every host array copied to the device): bit for bit on the
  # fenced CPU backend, and within tolerance on a GPU (skipped, exit 77, without one).
  troupe_add_test(NAME policy.device_path OWN_MAIN SOURCES ${CMAKE_CURRENT_LIST_DIR}/device_path.test.cpp
                  LIBS troupe::policy ENV OMP_WAIT_POLICY=PASSIVE)
  troupe_add_gpu_test(NAME gpu.model_on_cuda TARGET policy_model_on_cuda_test
                      SOURCES ${CMAKE_CURRENT_LIST_DIR}/device_path.test.cpp LIBS troupe::policy)
  target_compile_definitions(policy_model_on_cuda_test PRIVATE TROUPE_TEST_DEVICE="cuda")
endif()
if(TROUPE_BUILD_TESTS)
  # LoRA: adapter arena, merged-weights forward, finite differences, frozen base, bad configurations.
  troupe_add_test(NAME policy.lora SOURCES ${CMAKE_CURRENT_LIST_DIR}/lora.test.cpp LIBS troupe::policy
                  ENV OMP_WAIT_POLICY=PASSIVE)
  # LoRA dropout: the mask, off/unarmed bit for bit, seeded, finite differences under a fixed mask.
  troupe_add_test(NAME policy.lora_dropout SOURCES ${CMAKE_CURRENT_LIST_DIR}/lora_dropout.test.cpp
                  LIBS troupe::policy ENV OMP_WAIT_POLICY=PASSIVE)
  # LoRA on routed experts: PEFT names, merged forward, grouped = masked, finite differences, round trip.
  troupe_add_test(NAME policy.lora_experts SOURCES ${CMAKE_CURRENT_LIST_DIR}/lora_experts.test.cpp
                  LIBS troupe::policy ENV OMP_WAIT_POLICY=PASSIVE)
endif()
if(TROUPE_BUILD_TESTS)
  # The memory planner's sizes against a real model's allocations (troupe plan reads them).
  troupe_add_test(NAME policy.memory_footprint SOURCES ${CMAKE_CURRENT_LIST_DIR}/memory_footprint.test.cpp
                  LIBS troupe::policy)
endif()
