# What dtrain's target links. Included by the installed package config, so a consumer's
# find_package(dtrain) finds every dependency itself (keep in step with the top-level
# CMakeLists.txt, which finds the same packages with REQUIRED).
include(CMakeFindDependencyMacro)
find_dependency(Threads)
find_dependency(ZLIB)
find_dependency(Torch)
find_dependency(Boost 1.71)   # Hana is header-only: Boost::headers
find_dependency(range-v3)
find_dependency(nlohmann_json 3.9)
