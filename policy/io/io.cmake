# safetensors, HF model directories, tokenizers. target_sources(troupe_policy PRIVATE ...) and tests here.
# PCRE2 runs the pre-tokenizer regexes of Hugging Face tokenizer.json files (\p{L}, look-ahead).
find_package(PkgConfig REQUIRED)
pkg_check_modules(TROUPE_PCRE2 REQUIRED IMPORTED_TARGET GLOBAL libpcre2-8)
target_sources(troupe_policy PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_dir.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_io.cpp
  # A sharded learner's checkpoint: shards.json + one file per rank (xxHash checksums).
  ${CMAKE_CURRENT_LIST_DIR}/sharded_weights.cpp
  ${CMAKE_CURRENT_LIST_DIR}/reward_model_dir.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gguf.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gguf_import.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gguf_quant.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gguf_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/chat_template.cpp
  # PEFT LoRA adapters: the files, the target kinds, the merge and the base fingerprint (xxHash).
  ${CMAKE_CURRENT_LIST_DIR}/peft_adapter.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lora_targets.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lora_merge.cpp
  # The Jinja subset of chat templates (internal headers beside them).
  ${CMAKE_CURRENT_LIST_DIR}/jinja/value.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja/lexer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja/parser.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja/renderer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja/builtins.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja/filters.cpp
)
target_link_libraries(troupe_policy PRIVATE PkgConfig::TROUPE_PCRE2)
if(NOT TARGET PkgConfig::TROUPE_XXHASH)
  pkg_check_modules(TROUPE_XXHASH REQUIRED IMPORTED_TARGET GLOBAL libxxhash)
endif()
target_link_libraries(troupe_policy PRIVATE PkgConfig::TROUPE_XXHASH)
if(TROUPE_BUILD_TESTS)
  troupe_add_test(NAME policy.safetensors SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors.test.cpp LIBS troupe::policy)
endif()
if(TROUPE_BUILD_TESTS)
  troupe_add_test(NAME policy.tokenizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/tokenizer.test.cpp LIBS troupe::policy)
endif()
if(TROUPE_BUILD_TESTS)
  troupe_add_test(NAME policy.model_dir SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_dir.test.cpp LIBS troupe::policy)
endif()
if(TROUPE_BUILD_TESTS)
  troupe_add_test(NAME policy.sharded_weights SOURCES ${CMAKE_CURRENT_LIST_DIR}/sharded_weights.test.cpp LIBS troupe::policy)
endif()
if(TROUPE_BUILD_TESTS)
  troupe_add_test(NAME policy.gguf SOURCES ${CMAKE_CURRENT_LIST_DIR}/gguf.test.cpp LIBS troupe::policy
    ENV "TROUPE_GGUF_FIXTURES=${PROJECT_SOURCE_DIR}/tests/gguf")
endif()
if(TROUPE_BUILD_TESTS)
  troupe_add_test(NAME policy.gguf_quant SOURCES ${CMAKE_CURRENT_LIST_DIR}/gguf_quant.test.cpp LIBS troupe::policy
    ENV "TROUPE_GGUF_FIXTURES=${PROJECT_SOURCE_DIR}/tests/gguf" OMP_WAIT_POLICY=PASSIVE)
endif()
if(TROUPE_BUILD_TESTS)
  troupe_add_test(NAME policy.gguf_import SOURCES ${CMAKE_CURRENT_LIST_DIR}/gguf_import.test.cpp LIBS troupe::policy
    ENV "TROUPE_GGUF_FIXTURES=${PROJECT_SOURCE_DIR}/tests/gguf")
endif()
if(TROUPE_BUILD_TESTS)
  troupe_add_test(NAME policy.chat_template SOURCES ${CMAKE_CURRENT_LIST_DIR}/chat_template.test.cpp LIBS troupe::policy)
endif()
if(TROUPE_BUILD_TESTS)
  set(_peft_env "TROUPE_PEFT_FIXTURES=${PROJECT_SOURCE_DIR}/tests/peft" "TROUPE_HF_FIXTURES=${PROJECT_SOURCE_DIR}/tests/hf_fixture")
  troupe_add_test(NAME policy.lora_peft_io SOURCES ${CMAKE_CURRENT_LIST_DIR}/peft_adapter.test.cpp LIBS troupe::policy
    ENV ${_peft_env})
  troupe_add_test(NAME policy.lora_merge_golden SOURCES ${CMAKE_CURRENT_LIST_DIR}/lora_merge.test.cpp LIBS troupe::policy
    ENV ${_peft_env})
endif()
if(TROUPE_BUILD_TESTS)
  # Sequence-classification (reward) models: loading, pooling, refusals; scores against transformers.
  troupe_add_test(NAME policy.reward_model SOURCES ${CMAKE_CURRENT_LIST_DIR}/reward_model_dir.test.cpp LIBS troupe::policy
    ENV "TROUPE_REWARD_FIXTURES=${PROJECT_SOURCE_DIR}/tests/reward_model" OMP_WAIT_POLICY=PASSIVE
    GROUP policy.reward_model_golden "RewardModelGolden.*")
endif()
if(TROUPE_BUILD_TESTS)
  # A learner's block of the experts built or loaded alone == the whole model's slice_experts, bit for bit.
  troupe_add_test(NAME policy.expert_parallel_block SOURCES ${CMAKE_CURRENT_LIST_DIR}/expert_block.test.cpp
    LIBS troupe::policy)
endif()
