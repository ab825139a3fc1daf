# Builds and runs tests/consumer/project against dtrain, as another project would use it:
#   cmake -DMODE=installed|subdirectory -DSETTINGS=<consumer_settings.cmake> [-DBUILD_TYPE=<config>]
#         -P run_consumer.cmake
# installed:    `cmake --install` this build of dtrain into a fresh prefix, then find_package(dtrain)
#               from there; the consumer must read dtrain's headers from the prefix alone.
# subdirectory: add_subdirectory(<dtrain's source tree>); dtrain's tests, examples and benchmarks
#               must stay out of the consumer's build.
# Every step that fails stops the script with "consumer test failed"; the consumer's own output is
# printed last, once every check has passed.

cmake_minimum_required(VERSION 3.22)

if(NOT MODE MATCHES "^(installed|subdirectory)$" OR NOT EXISTS "${SETTINGS}")
  message(FATAL_ERROR "consumer test failed: usage: cmake -DMODE=installed|subdirectory "
                      "-DSETTINGS=<file> -P run_consumer.cmake")
endif()
include("${SETTINGS}")

set(work "${WORK_ROOT}/${MODE}")
set(prefix "${work}/prefix")
set(build "${work}/build")

function(fail)
  string(JOIN "" text ${ARGN})
  message(FATAL_ERROR "consumer test failed (${MODE}): ${text}")
endfunction()

# Runs a command; on failure prints its output and stops.
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message("${out}")
    fail("${what} (exit status ${rc})")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${work}")
file(MAKE_DIRECTORY "${work}")

set(configure_args -S "${PROJECT_DIR}" -B "${build}" -G "${GENERATOR}"
    "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
    # Only the prefix below (installed) or the source tree (subdirectory) may provide dtrain.
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_LAUNCHER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER}")
endif()
if(BUILD_TYPE)
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
endif()
# Where dtrain's own build found its dependencies, for dtrain's package config to find them again.
foreach(hint IN LISTS DEPENDENCY_HINTS)
  list(APPEND configure_args "-D${hint}")
endforeach()
set(search_path ${PREFIX_PATH})
if(DEFINED ENV{CMAKE_PREFIX_PATH})
  cmake_path(CONVERT "$ENV{CMAKE_PREFIX_PATH}" TO_CMAKE_PATH_LIST env_search_path)
  list(APPEND search_path ${env_search_path})
endif()

if(MODE STREQUAL "installed")
  set(install_args --install "${DTRAIN_BINARY_DIR}" --prefix "${prefix}")
  if(BUILD_TYPE)
    list(APPEND install_args --config "${BUILD_TYPE}")
  endif()
  step("cmake --install ${DTRAIN_BINARY_DIR} --prefix ${prefix}" "${CMAKE_COMMAND}" ${install_args})

  file(GLOB_RECURSE package_files "${prefix}/*/dtrainConfig.cmake")
  if(NOT EXISTS "${prefix}/include/dtrain/dtrain.hpp" OR NOT package_files)
    fail("the install put no include/dtrain/dtrain.hpp or no dtrainConfig.cmake under ${prefix}")
  endif()
  # The installed package must not point back into the source or build tree.
  list(GET package_files 0 package_config)
  get_filename_component(package_dir "${package_config}" DIRECTORY)
  file(GLOB package_files "${package_dir}/*.cmake")
  foreach(file IN LISTS package_files)
    file(READ "${file}" text)
    foreach(tree "${DTRAIN_SOURCE_DIR}/include" "${DTRAIN_BINARY_DIR}/")
      string(FIND "${text}" "${tree}" at)
      if(NOT at EQUAL -1)
        fail("the installed ${file} names ${tree}: the package must stand on its own")
      endif()
    endforeach()
  endforeach()

  list(PREPEND search_path "${prefix}")
  set(expected_include_dir "${prefix}/include")
else()
  list(APPEND configure_args "-DDTRAIN_CONSUMER_SOURCE_DIR=${DTRAIN_SOURCE_DIR}")
  set(expected_include_dir "${DTRAIN_SOURCE_DIR}/include")
endif()

# The search path goes through the environment, which keeps a list out of the command line.
if(search_path)
  cmake_path(CONVERT "${search_path}" TO_NATIVE_PATH_LIST native_search_path)
  set(ENV{CMAKE_PREFIX_PATH} "${native_search_path}")
endif()
step("configuring the consumer" "${CMAKE_COMMAND}" ${configure_args})
step("building the consumer" "${CMAKE_COMMAND}" --build "${build}")

if(MODE STREQUAL "installed")
  # find_package found the fresh prefix's package, not another one.
  file(STRINGS "${build}/CMakeCache.txt" dtrain_dir REGEX "^dtrain_DIR:")
  string(REGEX REPLACE "^[^=]*=" "" dtrain_dir "${dtrain_dir}")
  string(FIND "${dtrain_dir}" "${prefix}/" at)
  if(NOT at EQUAL 0)
    fail("find_package(dtrain) used ${dtrain_dir}, not the package installed under ${prefix}")
  endif()
else()
  # What dtrain adds with add_subdirectory for its tests, examples and benchmarks.
  foreach(dir tests examples benchmarks)
    if(EXISTS "${build}/dtrain/${dir}")
      fail("dtrain's ${dir}/ is part of the consumer's build (${build}/dtrain/${dir})")
    endif()
  endforeach()
endif()

# Every dtrain header the compiler read came from the expected tree: the installed one, never the
# source tree. Ninja keeps the headers each object was compiled from.
if(GENERATOR STREQUAL "Ninja")
  step("listing the consumer's header dependencies" "${MAKE_PROGRAM}" -C "${build}" -t deps)
  string(REPLACE "\n" ";" deps "${step_output}")
  set(dtrain_headers 0)
  foreach(line IN LISTS deps)
    string(STRIP "${line}" path)
    if(NOT path MATCHES "/dtrain/[^ ]*\\.hpp$")
      continue()
    endif()
    math(EXPR dtrain_headers "${dtrain_headers} + 1")
    string(FIND "${path}" "${expected_include_dir}/dtrain/" at)
    if(NOT at EQUAL 0)
      fail("the consumer was compiled with ${path}; every dtrain header must come from "
           "${expected_include_dir}")
    endif()
  endforeach()
  if(dtrain_headers EQUAL 0)
    fail("no dtrain header among the consumer's dependencies:\n${step_output}")
  endif()
  message(STATUS "${dtrain_headers} dtrain headers, all from ${expected_include_dir}")
endif()

execute_process(COMMAND "${build}/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message("${out}")
  fail("the consumer exited with status ${rc}")
endif()
message(STATUS "consumer: ${out}")
