# proplab_module(NAME DEPS ...): a static library from src/NAME/*.cpp, one per module folder.
function(proplab_module name)
  cmake_parse_arguments(ARG "WHOLE_ARCHIVE" "" "DEPS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${name}/*.cpp)
  if(NOT sources)
    # A header-only module (so far).
    add_library(proplab_${name} INTERFACE)
    target_include_directories(proplab_${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(proplab_${name} INTERFACE ${ARG_DEPS})
    add_library(proplab::${name} ALIAS proplab_${name})
    return()
  endif()
  add_library(proplab_${name} STATIC ${sources})
  target_include_directories(proplab_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(proplab_${name} PUBLIC ${ARG_DEPS})
  target_compile_options(proplab_${name} PRIVATE -Wall -Wextra)
  if(PROPLAB_NATIVE)
    target_compile_options(proplab_${name} PRIVATE -march=native)
  endif()
  if(ARG_WHOLE_ARCHIVE)
    # Objects that only self-register (static registrars) must all be linked, referenced or not.
    add_library(proplab_${name}_whole INTERFACE)
    target_link_libraries(proplab_${name}_whole INTERFACE "$<LINK_LIBRARY:WHOLE_ARCHIVE,proplab_${name}>")
    add_library(proplab::${name} ALIAS proplab_${name}_whole)
  else()
    add_library(proplab::${name} ALIAS proplab_${name})
  endif()
endfunction()

# add_proplab_test(MODULE LIBS ...): one GoogleTest binary per tests/MODULE folder.
function(add_proplab_test module)
  cmake_parse_arguments(ARG "" "" "LIBS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${module}/*.cpp)
  add_executable(test_${module} ${sources})
  target_link_libraries(test_${module} PRIVATE ${ARG_LIBS} proplab_test_support GTest::gtest GTest::gtest_main)
  target_compile_options(test_${module} PRIVATE -Wall -Wextra)
  # One variable per property: gtest_discover_tests splits a ';' inside a property value (CMake 3.25), so
  # "A=1;B=2" in ENVIRONMENT would set only A.
  gtest_discover_tests(test_${module} DISCOVERY_MODE PRE_TEST
    PROPERTIES ENVIRONMENT "PROPLAB_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
               ENVIRONMENT_MODIFICATION "PROPLAB_BINARY=set:$<TARGET_FILE:proplab>"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
endfunction()
