# SPDX-License-Identifier: Apache-2.0
# Conan 2 recipe for dtrain: `conan create .` packages the headers (and their impl/*.ipp bodies) and
# the license, and runs test_package/ against them. With `-o "dtrain/*:separate_compilation=True"`
# it builds dtrain's library (CMake's DTRAIN_SEPARATE_COMPILATION) and packages libdtrain.a with the
# headers: programs then compile against declarations and link the library (docs/packaging.md says
# which to pick). Conan's CMakeDeps writes the dtrain-config.cmake that consumers load, from
# package_info() below. Version and requirements must agree with include/dtrain/version.hpp and
# CMakeLists.txt (ctest: package.metadata_agrees). docs/packaging.md says what was and was not run
# with Conan itself.
import os

from conan import ConanFile
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, rmdir
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0"


class DtrainConan(ConanFile):
    name = "dtrain"
    version = "0.1.0"
    description = "Data-parallel training for LibTorch, configured at compile time"
    license = "Apache-2.0"
    topics = ("deep-learning", "distributed-training", "libtorch", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"separate_compilation": [True, False]}
    default_options = {"separate_compilation": False}
    exports_sources = "LICENSE", "include/*", "src/*", "cmake/*", "CMakeLists.txt"

    def configure(self):
        if self.options.separate_compilation:
            self.package_type = "static-library"

    def layout(self):
        if self.options.separate_compilation:
            cmake_layout(self, src_folder=".")
        else:
            basic_layout(self, src_folder=".")

    def requirements(self):
        # dtrain's headers include all of these, so consumers compile against them too.
        self.requires("libtorch/2.4.0", transitive_headers=True, transitive_libs=True)
        self.requires("boost/1.83.0", transitive_headers=True)
        self.requires("range-v3/0.12.0", transitive_headers=True)
        self.requires("nlohmann_json/3.11.3", transitive_headers=True)
        self.requires("zlib/1.3.1", transitive_headers=True, transitive_libs=True)

    def package_id(self):
        if not self.info.options.separate_compilation:
            self.info.clear()

    def generate(self):
        if not self.options.separate_compilation:
            return
        toolchain = CMakeToolchain(self)
        # dtrain's packaging options (scripts/check-packaging checks them), and the library.
        toolchain.cache_variables.update({"DTRAIN_BUILD_TESTS": False, "DTRAIN_BUILD_EXAMPLES": False,
                                          "DTRAIN_BUILD_BENCHMARKS": False, "DTRAIN_INSTALL": True,
                                          "DTRAIN_SEPARATE_COMPILATION": True})
        toolchain.generate()
        CMakeDeps(self).generate()

    def build(self):
        if self.options.separate_compilation:
            cmake = CMake(self)
            cmake.configure()
            cmake.build()

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        if self.options.separate_compilation:
            CMake(self).install()
            # Consumers get Conan's own config (package_info), not dtrain's CMake package.
            rmdir(self, os.path.join(self.package_folder, "lib", "cmake"))
        else:
            for pattern in ("*.hpp", "*.ipp"):
                copy(self, pattern, os.path.join(self.source_folder, "include"),
                     os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "dtrain")
        self.cpp_info.set_property("cmake_target_name", "dtrain::dtrain")
        self.cpp_info.bindirs = []
        # Stated, not guessed from the include path (dtrain's CMake package does the same).
        # ConanCenter's libtorch has no CUDA option yet, so the CUDA path is off.
        self.cpp_info.defines = ["DTRAIN_WITH_CUDA=0"]
        if self.options.separate_compilation:
            self.cpp_info.libs = ["dtrain"]
            self.cpp_info.defines.append("DTRAIN_SEPARATE_COMPILATION")
        else:
            self.cpp_info.libdirs = []
        self.cpp_info.requires = [
            "libtorch::libtorch",
            "boost::headers",
            "range-v3::range-v3",
            "nlohmann_json::nlohmann_json",
            "zlib::zlib",
        ]
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["pthread"]
