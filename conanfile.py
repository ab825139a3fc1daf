# SPDX-License-Identifier: Apache-2.0
# Conan 2 recipe for dtrain, a header-only library: `conan create .` packages the headers and the
# license, and runs test_package/ against them. Conan's CMakeDeps writes the dtrain-config.cmake that
# consumers load, from package_info() below. Version and requirements must agree with
# include/dtrain/version.hpp and CMakeLists.txt (ctest: package.metadata_agrees).
# docs/packaging.md says what was and was not run with Conan itself.
import os

from conan import ConanFile
from conan.tools.files import copy
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
    exports_sources = "LICENSE", "include/*"
    no_copy_source = True

    def layout(self):
        basic_layout(self, src_folder=".")

    def requirements(self):
        # dtrain's headers include all of these, so consumers compile against them too.
        self.requires("libtorch/2.4.0", transitive_headers=True, transitive_libs=True)
        self.requires("boost/1.83.0", transitive_headers=True)
        self.requires("range-v3/0.12.0", transitive_headers=True)
        self.requires("nlohmann_json/3.11.3", transitive_headers=True)
        self.requires("zlib/1.3.1", transitive_headers=True, transitive_libs=True)

    def package_id(self):
        self.info.clear()

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        copy(self, "*.hpp", os.path.join(self.source_folder, "include"),
             os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "dtrain")
        self.cpp_info.set_property("cmake_target_name", "dtrain::dtrain")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        # Stated, not guessed from the include path (dtrain's CMake package does the same).
        # ConanCenter's libtorch has no CUDA option yet, so the CUDA path is off.
        self.cpp_info.defines = ["DTRAIN_WITH_CUDA=0"]
        self.cpp_info.requires = [
            "libtorch::libtorch",
            "boost::headers",
            "range-v3::range-v3",
            "nlohmann_json::nlohmann_json",
            "zlib::zlib",
        ]
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["pthread"]
