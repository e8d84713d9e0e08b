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
    proplab_register_module(${name} proplab_${name} proplab::${name})
    return()
  endif()
  add_library(proplab_${name} STATIC ${sources})
  proplab_register_module(${name} proplab_${name} proplab::${name} proplab_${name}_whole)
  # Its own headers only ("<name>/..."): a module sees another's headers only by linking it (the architecture test
  # then checks that it links it directly).
  set(include_root ${PROJECT_BINARY_DIR}/module_include/${name})
  file(MAKE_DIRECTORY ${include_root})
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${name} ${include_root}/${name} SYMBOLIC)
  target_include_directories(proplab_${name} PUBLIC ${include_root})
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
  target_precompile_headers(test_${module} REUSE_FROM proplab_test_support)
  # One variable per property: gtest_discover_tests splits a ';' inside a property value (CMake 3.25), so
  # "A=1;B=2" in ENVIRONMENT would set only A.
  # Listing the tests takes well under a second, but on a shared, loaded machine the default 5 s timeout has
  # been exceeded (test_ops, while other jobs held both cores).
  gtest_discover_tests(test_${module} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES ENVIRONMENT "PROPLAB_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
               ENVIRONMENT_MODIFICATION "PROPLAB_BINARY=set:$<TARGET_FILE:proplab>"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
endfunction()

# The module arrows as the build declares them, for the architecture test (tests/architecture/check_modules.py).
# proplab_register_module(FOLDER TARGET [ALIASES ...]): TARGET (or any of ALIASES, as other targets name it) is the
# module in FOLDER ("ops", "gui/data", "kernels", "cli").
function(proplab_register_module folder target)
  set_property(GLOBAL APPEND PROPERTY PROPLAB_MODULE_TARGETS "${target}")
  foreach(name ${target} ${ARGN})
    set_property(GLOBAL PROPERTY PROPLAB_MODULE_OF_${name} "${folder}")
  endforeach()
endfunction()

# Writes PATH: one line per registered module target, "folder: the folders of the modules it links directly", and
# "absent: ..." naming the OPTIONAL folders this configuration does not build (code includes them conditionally).
function(proplab_write_module_deps path)
  cmake_parse_arguments(ARG "" "" "OPTIONAL" ${ARGN})
  get_property(targets GLOBAL PROPERTY PROPLAB_MODULE_TARGETS)
  set(text "")
  set(absent "")
  foreach(folder ${ARG_OPTIONAL})
    set(built FALSE)
    foreach(target ${targets})
      get_property(of GLOBAL PROPERTY PROPLAB_MODULE_OF_${target})
      if(of STREQUAL folder)
        set(built TRUE)
      endif()
    endforeach()
    if(NOT built)
      list(APPEND absent ${folder})
    endif()
  endforeach()
  list(JOIN absent " " joined_absent)
  string(APPEND text "absent: ${joined_absent}\n")
  foreach(target ${targets})
    get_property(folder GLOBAL PROPERTY PROPLAB_MODULE_OF_${target})
    get_target_property(links ${target} LINK_LIBRARIES)
    set(deps "")
    foreach(link ${links})
      get_property(dep GLOBAL PROPERTY PROPLAB_MODULE_OF_${link})
      if(dep AND NOT dep STREQUAL folder)
        list(APPEND deps ${dep})
      endif()
    endforeach()
    list(REMOVE_DUPLICATES deps)
    list(JOIN deps " " joined)
    string(APPEND text "${folder}: ${joined}\n")
  endforeach()
  file(WRITE ${path} "${text}")
endfunction()
