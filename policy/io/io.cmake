# safetensors, HF model directories, tokenizers. target_sources(troupe_policy PRIVATE ...) and tests here.
target_sources(troupe_policy PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
)
if(TROUPE_BUILD_TESTS)
  troupe_add_test(NAME policy.safetensors SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors.test.cpp LIBS troupe::policy)
endif()
