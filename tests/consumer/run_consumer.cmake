# SPDX-License-Identifier: Apache-2.0
# Builds and runs a program against dtrain the way another project would get it:
#   cmake -DMODE=<mode> -DSETTINGS=<consumer_settings.cmake> [-DBUILD_TYPE=<config>] -P run_consumer.cmake
# installed:    `cmake --install` this build of dtrain into a fresh prefix; find_package(dtrain) there.
# relocated:    the same, then the prefix is moved elsewhere before the consumer uses it.
# buildtree:    find_package(dtrain) with dtrain_DIR=<this build tree>, nothing installed.
# subdirectory: add_subdirectory(<dtrain's source tree>).
# fetchcontent: FetchContent from a local git clone of the source tree (its files as they are now).
# deb:          the dtrain-dev .deb that scripts/build-deb made (DEB_DIR), unpacked with dpkg -x.
# staging:      what Conan and vcpkg do: a fresh configure with the packaging options, an install
#               into a staging prefix that is then moved; Conan's test_package/ and the vcpkg
#               manifest example (which holds ports/dtrain/usage's lines) are built against it.
# installed_compiled, installed_header_only: a fresh configure in the other mode than this build's
#               (DTRAIN_SEPARATE_COMPILATION ON: libdtrain.a, the config under lib/cmake/dtrain, the
#               program links the library; OFF: no library, the config under share/), installed
#               into a fresh prefix. With `installed`, the installed package is tested in both modes.
# cuda_config:  a fresh configure with DTRAIN_CUDA=ON (CUDA toolkit and NCCL, no CUDA LibTorch
#               needed), installed; the consumer only configures, and checks that the package
#               defines DTRAIN_WITH_CUDA=1 and links NCCL and cudart.
# The consumer must read every dtrain header from the expected tree and print the expected line.
# Every step that fails stops the script with "consumer test failed"; the consumer's own output is
# printed last, once every check has passed.

cmake_minimum_required(VERSION 3.24)

set(modes installed relocated buildtree subdirectory fetchcontent deb staging cuda_config installed_compiled
          installed_header_only)
if(NOT MODE IN_LIST modes OR NOT EXISTS "${SETTINGS}")
  string(JOIN "|" usage ${modes})
  message(FATAL_ERROR "consumer test failed: usage: cmake -DMODE=${usage} -DSETTINGS=<file> "
                      "-P run_consumer.cmake")
endif()
include("${SETTINGS}")

# What Conan's recipe, vcpkg's portfile and debian/rules pass to dtrain's configure
# (scripts/check-packaging checks that they do).
set(packaging_options -DDTRAIN_BUILD_TESTS=OFF -DDTRAIN_BUILD_EXAMPLES=OFF
                      -DDTRAIN_BUILD_BENCHMARKS=OFF -DDTRAIN_INSTALL=ON)

set(work "${WORK_ROOT}/${MODE}")

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

# The search path: this build's, then the environment's; a package prefix goes first.
set(search_path ${PREFIX_PATH})
if(DEFINED ENV{CMAKE_PREFIX_PATH})
  cmake_path(CONVERT "$ENV{CMAKE_PREFIX_PATH}" TO_CMAKE_PATH_LIST env_search_path)
  list(APPEND search_path ${env_search_path})
endif()

# The arguments every configure here shares: generator, compiler, where the dependencies are.
set(common_args -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
    # Only the prefix, tree or clone under test may provide dtrain.
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
if(MAKE_PROGRAM)
  list(APPEND common_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_LAUNCHER)
  list(APPEND common_args "-DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER}")
endif()
if(BUILD_TYPE)
  list(APPEND common_args "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
endif()
# Where dtrain's own build found its dependencies, for dtrain's package config to find them again.
foreach(hint IN LISTS DEPENDENCY_HINTS)
  list(APPEND common_args "-D${hint}")
endforeach()

# Configures dtrain's source tree afresh with the packaging options (and ARGN), builds it (the
# library, when compiled; nothing header-only) and installs it into <prefix>. Nothing of this test's own build tree is reused.
function(install_fresh prefix)
  set(dtrain_build "${work}/dtrain-build")
  step("configuring dtrain for packaging" "${CMAKE_COMMAND}" -S "${DTRAIN_SOURCE_DIR}" -B "${dtrain_build}"
       ${common_args} ${packaging_options} "-DCMAKE_INSTALL_PREFIX=${prefix}" ${ARGN})
  step("building dtrain (its library, when compiled)" "${CMAKE_COMMAND}" --build "${dtrain_build}")
  step("installing dtrain into ${prefix}" "${CMAKE_COMMAND}" --install "${dtrain_build}")
endfunction()

# A package (installed or unpacked) under <prefix>: its headers and config are there, and none of
# its CMake files names the source tree, the build tree or any of the paths in ARGN.
# A header-only package's config lies under share/ (architecture-independent), a compiled one's
# under lib/, beside libdtrain.a: installed_compiled's, and installed's and relocated's where this
# build is compiled (they install this build).
function(check_package prefix)
  if(MODE STREQUAL "installed_compiled" OR (SEPARATE_COMPILATION AND MODE MATCHES "^(installed|relocated)$"))
    set(config_dir "${prefix}/lib/cmake/dtrain")
  else()
    set(config_dir "${prefix}/share/cmake/dtrain")
  endif()
  file(GLOB_RECURSE configs "${prefix}/*/dtrainConfig.cmake")
  if(NOT EXISTS "${prefix}/include/dtrain/dtrain.hpp" OR NOT configs)
    fail("no include/dtrain/dtrain.hpp or no dtrainConfig.cmake under ${prefix}")
  endif()
  list(GET configs 0 config)
  if(NOT config STREQUAL "${config_dir}/dtrainConfig.cmake")
    fail("the package config is ${config}, not ${config_dir}/dtrainConfig.cmake")
  endif()
  file(GLOB package_files "${config_dir}/*.cmake")
  foreach(file IN LISTS package_files)
    file(READ "${file}" text)
    foreach(path "${DTRAIN_SOURCE_DIR}/" "${DTRAIN_BINARY_DIR}/" "${work}/dtrain-build" ${ARGN})
      string(FIND "${text}" "${path}" at)
      if(NOT at EQUAL -1)
        fail("${file} names ${path}: the package must stand on its own")
      endif()
    endforeach()
  endforeach()
endfunction()

# Configures and builds <project> into <build> with ARGN, checks that every dtrain header it was
# compiled with lies under <include_dir>, and runs <build>/<program> <MODE>.
function(consume project build include_dir program)
  cmake_path(CONVERT "${search_path}" TO_NATIVE_PATH_LIST native_search_path)
  # The search path goes through the environment, which keeps a list out of the command line.
  set(ENV{CMAKE_PREFIX_PATH} "${native_search_path}")
  step("configuring ${project}" "${CMAKE_COMMAND}" -S "${project}" -B "${build}" ${common_args} ${ARGN})
  set(configure_output "${step_output}" PARENT_SCOPE)
  if(CONFIGURE_ONLY)
    return()
  endif()
  step("building ${project}" "${CMAKE_COMMAND}" --build "${build}")

  # Ninja keeps the headers each object was compiled from.
  if(GENERATOR STREQUAL "Ninja")
    step("listing the header dependencies" "${MAKE_PROGRAM}" -C "${build}" -t deps)
    string(REPLACE "\n" ";" deps "${step_output}")
    set(dtrain_headers 0)
    foreach(line IN LISTS deps)
      string(STRIP "${line}" path)
      if(NOT path MATCHES "/dtrain/[^ ]*\\.hpp$")
        continue()
      endif()
      # Relative paths (ccache's CCACHE_BASEDIR rewrites them so) are relative to the build tree.
      get_filename_component(path "${path}" ABSOLUTE BASE_DIR "${build}")
      math(EXPR dtrain_headers "${dtrain_headers} + 1")
      string(FIND "${path}" "${include_dir}/dtrain/" at)
      if(NOT at EQUAL 0)
        fail("${program} was compiled with ${path}; every dtrain header must come from ${include_dir}")
      endif()
    endforeach()
    if(dtrain_headers EQUAL 0)
      fail("no dtrain header among ${program}'s dependencies:\n${step_output}")
    endif()
    message(STATUS "${program}: ${dtrain_headers} dtrain headers, all from ${include_dir}")
  endif()

  execute_process(COMMAND "${build}/${program}" "${MODE}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message("${out}")
    fail("${program} exited with status ${rc}")
  endif()
  set(consumer_output "${consumer_output}${out}" PARENT_SCOPE)
endfunction()

set(project "${PROJECT_DIR}")
set(consumer_args "-DDTRAIN_CONSUMER_EXPECT_CUDA=${WITH_CUDA}")
set(CONFIGURE_ONLY OFF)
set(consumer_output "")

if(MODE MATCHES "^(installed|relocated)$")
  set(prefix "${work}/prefix")
  set(install_args --install "${DTRAIN_BINARY_DIR}" --prefix "${prefix}")
  if(BUILD_TYPE)
    list(APPEND install_args --config "${BUILD_TYPE}")
  endif()
  step("cmake --install ${DTRAIN_BINARY_DIR} --prefix ${prefix}" "${CMAKE_COMMAND}" ${install_args})
  if(MODE STREQUAL "relocated")
    # Moved as a whole: nothing may remain where it was installed.
    set(first "${prefix}")
    set(prefix "${work}/moved/elsewhere")
    file(MAKE_DIRECTORY "${work}/moved")
    file(RENAME "${first}" "${prefix}")
    check_package("${prefix}" "${first}")
  else()
    check_package("${prefix}")
  endif()
  list(PREPEND search_path "${prefix}")
  consume("${project}" "${work}/build" "${prefix}/include" consumer ${consumer_args})
  # find_package found this prefix's package, not another one.
  file(STRINGS "${work}/build/CMakeCache.txt" dtrain_dir REGEX "^dtrain_DIR:")
  if(NOT dtrain_dir MATCHES "=${prefix}/(share|lib)/cmake/dtrain$")
    fail("find_package(dtrain) used ${dtrain_dir}, not the package under ${prefix}")
  endif()
  if(MODE STREQUAL "installed")
    # Below 1.0 only the same minor version is compatible: a project written for the previous minor
    # version must not get this one (SameMajorVersion would hand 0.1 to find_package(dtrain 0.0)).
    file(GLOB version_file "${prefix}/*/cmake/dtrain/dtrainConfigVersion.cmake")
    file(STRINGS "${version_file}" version_line
         REGEX "^set\\(PACKAGE_VERSION \"[0-9.]+\"\\)")
    string(REGEX MATCH "([0-9]+)\\.([0-9]+)" _ "${version_line}")
    set(major "${CMAKE_MATCH_1}")
    set(minor "${CMAKE_MATCH_2}")
    if(major EQUAL 0 AND minor GREATER 0)
      math(EXPR older_minor "${minor} - 1")
      set(older "0.${older_minor}")
      file(WRITE "${work}/older/CMakeLists.txt"
           "cmake_minimum_required(VERSION 3.24)\nproject(older LANGUAGES NONE)\n"
           "find_package(dtrain ${older} CONFIG QUIET)\n"
           "if(dtrain_FOUND)\n  message(FATAL_ERROR \"find_package(dtrain ${older}) accepted \${dtrain_VERSION}\")\nendif()\n")
      step("find_package(dtrain ${older}) refusing dtrain ${major}.${minor}" "${CMAKE_COMMAND}"
           -S "${work}/older" -B "${work}/older-build" "-DCMAKE_PREFIX_PATH=${prefix}"
           -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
    endif()
    # Without Gloo's headers find_package(dtrain) fails, saying which package to install.
    file(WRITE "${work}/no-gloo/CMakeLists.txt"
         "cmake_minimum_required(VERSION 3.24)\nproject(no_gloo LANGUAGES CXX)\n"
         "find_package(dtrain CONFIG REQUIRED)\n")
    execute_process(COMMAND "${CMAKE_COMMAND}" -S "${work}/no-gloo" -B "${work}/no-gloo-build"
                            ${common_args} "-DDTRAIN_GLOO_INCLUDE_DIR=${work}/no-gloo"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    string(REGEX REPLACE "[ \t\r\n]+" " " out "${out}")
    if(rc EQUAL 0 OR NOT out MATCHES "Gloo's headers \\(gloo/algorithm.h\\) were not found.*apt-get install libgloo-dev")
      fail("find_package(dtrain) without Gloo's headers did not fail naming libgloo-dev (exit status ${rc}):\n${out}")
    endif()
  endif()

elseif(MODE MATCHES "^installed_(compiled|header_only)$")
  set(prefix "${work}/prefix")
  if(MODE STREQUAL "installed_compiled")
    set(compiled ON)
  else()
    set(compiled OFF)
  endif()
  install_fresh("${prefix}" -DDTRAIN_SEPARATE_COMPILATION=${compiled})
  check_package("${prefix}")
  if(compiled AND NOT EXISTS "${prefix}/lib/libdtrain.a")
    fail("the compiled package has no ${prefix}/lib/libdtrain.a")
  elseif(NOT compiled AND EXISTS "${prefix}/lib/libdtrain.a")
    fail("the header-only package holds ${prefix}/lib/libdtrain.a")
  endif()
  list(PREPEND search_path "${prefix}")
  consume("${project}" "${work}/build" "${prefix}/include" consumer ${consumer_args})
  file(READ "${work}/build/build.ninja" rules)
  string(FIND "${rules}" "${prefix}/lib/libdtrain.a" at)
  if(compiled AND at EQUAL -1)
    fail("the consumer does not link ${prefix}/lib/libdtrain.a")
  elseif(NOT compiled AND NOT at EQUAL -1)
    fail("the header-only consumer links ${prefix}/lib/libdtrain.a")
  endif()

elseif(MODE STREQUAL "buildtree")
  if(NOT EXISTS "${DTRAIN_BINARY_DIR}/dtrainTargets.cmake")
    fail("${DTRAIN_BINARY_DIR} has no dtrainTargets.cmake: configure dtrain with DTRAIN_INSTALL=ON")
  endif()
  consume("${project}" "${work}/build" "${DTRAIN_SOURCE_DIR}/include" consumer ${consumer_args}
          "-Ddtrain_DIR=${DTRAIN_BINARY_DIR}")

elseif(MODE STREQUAL "subdirectory")
  consume("${project}" "${work}/build" "${DTRAIN_SOURCE_DIR}/include" consumer ${consumer_args}
          "-DDTRAIN_CONSUMER_SOURCE_DIR=${DTRAIN_SOURCE_DIR}")
  foreach(dir tests examples benchmarks)
    if(EXISTS "${work}/build/dtrain/${dir}")
      fail("dtrain's ${dir}/ is part of the consumer's build (${work}/build/dtrain/${dir})")
    endif()
  endforeach()

elseif(MODE STREQUAL "fetchcontent")
  # A local clone with the source tree's files as they are now (tracked and new, not ignored), so
  # the test covers uncommitted work too; FetchContent clones it over file://.
  if(NOT GIT_EXECUTABLE)
    fail("git was not found; FetchContent's test clones a git repository")
  endif()
  step("listing dtrain's files (git ls-files)" "${GIT_EXECUTABLE}" -C "${DTRAIN_SOURCE_DIR}"
       ls-files --cached --others --exclude-standard)
  string(REPLACE "\n" ";" files "${step_output}")
  set(repo "${work}/dtrain.git-src")
  set(copied 0)
  foreach(file IN LISTS files)
    if(file AND EXISTS "${DTRAIN_SOURCE_DIR}/${file}" AND NOT IS_DIRECTORY "${DTRAIN_SOURCE_DIR}/${file}")
      get_filename_component(dir "${repo}/${file}" DIRECTORY)
      file(MAKE_DIRECTORY "${dir}")
      file(COPY_FILE "${DTRAIN_SOURCE_DIR}/${file}" "${repo}/${file}")
      math(EXPR copied "${copied} + 1")
    endif()
  endforeach()
  set(git "${GIT_EXECUTABLE}" -C "${repo}" -c user.name=dtrain-test -c user.email=test@dtrain.invalid
      -c commit.gpgsign=false)
  step("git init" ${git} init -q)
  step("git add" ${git} add -A)
  step("git commit" ${git} commit -q -m "dtrain for the FetchContent test")
  step("git rev-parse" ${git} rev-parse HEAD)
  string(STRIP "${step_output}" commit)
  message(STATUS "FetchContent from file://${repo} at ${commit} (${copied} files)")
  consume("${project}" "${work}/build" "${work}/build/_deps/dtrain-src/include" consumer ${consumer_args}
          "-DDTRAIN_CONSUMER_GIT_REPOSITORY=file://${repo}" "-DDTRAIN_CONSUMER_GIT_TAG=${commit}")
  foreach(dir tests examples benchmarks)
    if(EXISTS "${work}/build/_deps/dtrain-build/${dir}")
      fail("dtrain's ${dir}/ is part of the consumer's build")
    endif()
  endforeach()

elseif(MODE STREQUAL "deb")
  file(GLOB debs "${DEB_DIR}/dtrain-dev_*_all.deb")
  list(LENGTH debs count)
  if(NOT count EQUAL 1)
    fail("expected one dtrain-dev_*_all.deb in ${DEB_DIR} (made by the test package.deb, "
         "scripts/build-deb), found ${count}: ${debs}")
  endif()
  set(root "${work}/root")
  step("dpkg -x ${debs} ${root}" dpkg -x "${debs}" "${root}")
  set(prefix "${root}/usr")
  check_package("${prefix}")
  list(PREPEND search_path "${prefix}")
  consume("${project}" "${work}/build" "${prefix}/include" consumer ${consumer_args})

elseif(MODE STREQUAL "staging")
  set(stage "${work}/stage")
  install_fresh("${stage}")
  # Conan packages into its cache and vcpkg copies packages/ into installed/: the files move.
  set(prefix "${work}/package")
  file(RENAME "${stage}" "${prefix}")
  check_package("${prefix}" "${stage}")
  list(PREPEND search_path "${prefix}")
  consume("${DTRAIN_SOURCE_DIR}/test_package" "${work}/test_package" "${prefix}/include" test_package)

  # vcpkg prints ports/dtrain/usage after an install; the manifest example's CMakeLists.txt holds
  # its lines as they are, and is built against the same prefix.
  set(example "${DTRAIN_SOURCE_DIR}/packaging/vcpkg-example")
  file(STRINGS "${DTRAIN_SOURCE_DIR}/ports/dtrain/usage" usage_lines REGEX "^    ")
  file(READ "${example}/CMakeLists.txt" example_cmake)
  if(NOT usage_lines)
    fail("ports/dtrain/usage shows no CMake lines (indented by four spaces)")
  endif()
  foreach(line IN LISTS usage_lines)
    string(STRIP "${line}" line)
    string(FIND "${example_cmake}" "${line}" at)
    if(at EQUAL -1)
      fail("${example}/CMakeLists.txt lacks ports/dtrain/usage's line '${line}'")
    endif()
  endforeach()
  consume("${example}" "${work}/vcpkg-example" "${prefix}/include" main)

elseif(MODE STREQUAL "cuda_config")
  set(prefix "${work}/prefix")
  install_fresh("${prefix}" -DDTRAIN_CUDA=ON)
  check_package("${prefix}")
  file(READ "${prefix}/share/cmake/dtrain/dtrainDependencies.cmake" dependencies)
  if(NOT dependencies MATCHES "set\\(DTRAIN_WITH_CUDA 1\\)")
    fail("dtrainDependencies.cmake does not record DTRAIN_WITH_CUDA 1")
  endif()
  list(PREPEND search_path "${prefix}")
  set(CONFIGURE_ONLY ON)
  consume("${project}" "${work}/build" "${prefix}/include" consumer
          -DDTRAIN_CONSUMER_EXPECT_CUDA=1 -DDTRAIN_CONSUMER_CONFIGURE_ONLY=ON)
  if(NOT configure_output MATCHES "dtrain::dtrain links NCCL \\(([^)]+)\\) and CUDA::cudart")
    fail("the consumer's configure did not report NCCL and cudart:\n${configure_output}")
  endif()
  set(consumer_output "(${MODE}): dtrain::dtrain defines DTRAIN_WITH_CUDA=1, links ${CMAKE_MATCH_1} and CUDA::cudart\n")
endif()

message(STATUS "consumer: ${consumer_output}")
