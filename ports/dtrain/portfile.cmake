# SPDX-License-Identifier: Apache-2.0
# vcpkg port for dtrain, used as an overlay port from a checkout of dtrain:
#   vcpkg install dtrain --overlay-ports=<dtrain>/ports             header-only
#   vcpkg install "dtrain[compiled]" --overlay-ports=<dtrain>/ports  with dtrain's library
# It installs dtrain's own CMake package (headers and config under share/cmake/dtrain, where
# vcpkg expects it; with the feature `compiled`, libdtrain.a and the config under lib/cmake/dtrain,
# DTRAIN_SEPARATE_COMPILATION), with dtrain's tests, examples and benchmarks left out.
set(VCPKG_BUILD_TYPE release)   # header-only has one configuration; the library is built as Release

# The checkout this port lies in (ports/dtrain/ -> the repository root). A port in a registry
# would use vcpkg_from_github here instead.
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS FEATURES compiled DTRAIN_SEPARATE_COMPILATION)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    -DDTRAIN_BUILD_TESTS=OFF
    -DDTRAIN_BUILD_EXAMPLES=OFF
    -DDTRAIN_BUILD_BENCHMARKS=OFF
    -DDTRAIN_INSTALL=ON
    ${FEATURE_OPTIONS}
)
vcpkg_cmake_install()
if("compiled" IN_LIST FEATURES)
  vcpkg_cmake_config_fixup(PACKAGE_NAME dtrain CONFIG_PATH lib/cmake/dtrain)
else()
  vcpkg_cmake_config_fixup(PACKAGE_NAME dtrain CONFIG_PATH share/cmake/dtrain)
endif()

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
