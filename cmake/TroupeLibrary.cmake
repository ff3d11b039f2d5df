# One library per folder: troupe_library(NAME folder SOURCES ... [LINK ...] [PRIVATE_INCLUDE])
# makes troupe_<folder> with the alias troupe::<folder>, its public headers in <folder>/include,
# links LINK publicly and troupe::warnings privately. PRIVATE_INCLUDE adds the folder itself as a
# private include path (internal headers such as runtime/src/*.h). More sources may follow with
# target_sources(troupe_<folder> PRIVATE ...).
function(troupe_library)
  cmake_parse_arguments(L "PRIVATE_INCLUDE" "NAME" "SOURCES;LINK" ${ARGN})
  if(L_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "troupe_library(${L_NAME}): unknown arguments ${L_UNPARSED_ARGUMENTS}")
  endif()
  add_library(troupe_${L_NAME} ${L_SOURCES})
  add_library(troupe::${L_NAME} ALIAS troupe_${L_NAME})
  target_include_directories(troupe_${L_NAME} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
  if(L_PRIVATE_INCLUDE)
    target_include_directories(troupe_${L_NAME} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  endif()
  target_link_libraries(troupe_${L_NAME} PUBLIC ${L_LINK} PRIVATE troupe::warnings)
endfunction()
