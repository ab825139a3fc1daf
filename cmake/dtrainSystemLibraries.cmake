# SPDX-License-Identifier: Apache-2.0
# The libraries dtrain uses that come without a CMake package it can count on: Gloo's headers
# (backend::gloo includes LibTorch's ProcessGroupGloo.hpp, which includes them, and LibTorch's
# package does not add them) and NCCL (the CUDA path). dtrain's own build and its installed package
# config both use these functions, so a consumer finds the same files dtrain was built with.
#
# Each function creates an imported target, or sets <error_var> to a message that says what to
# install. Extra arguments (GLOBAL) go to add_library.

# dtrain::gloo_headers: Gloo's include directory.
function(dtrain_find_gloo_headers error_var)
  set(${error_var} "" PARENT_SCOPE)
  if(TARGET dtrain::gloo_headers)
    return()
  endif()
  find_path(DTRAIN_GLOO_INCLUDE_DIR gloo/algorithm.h
            # LibTorch's own include directories first: PyTorch's wheels carry Gloo's headers.
            HINTS ${Gloo_ROOT} $ENV{Gloo_ROOT} ${TORCH_INCLUDE_DIRS} PATH_SUFFIXES include
            DOC "The directory holding Gloo's headers (gloo/algorithm.h)")
  if(NOT EXISTS "${DTRAIN_GLOO_INCLUDE_DIR}/gloo/algorithm.h")   # not found, or set to a wrong place
    string(CONCAT message
        "Gloo's headers (gloo/algorithm.h) were not found (DTRAIN_GLOO_INCLUDE_DIR: "
        "${DTRAIN_GLOO_INCLUDE_DIR}). dtrain's backend::gloo includes LibTorch's "
        "ProcessGroupGloo.hpp, which includes them. Install them (Debian and Ubuntu: apt-get install "
        "libgloo-dev) or set DTRAIN_GLOO_INCLUDE_DIR to the directory that holds gloo/algorithm.h.")
    set(${error_var} "${message}" PARENT_SCOPE)
    return()
  endif()
  add_library(dtrain::gloo_headers INTERFACE IMPORTED ${ARGN})
  set_target_properties(dtrain::gloo_headers PROPERTIES
                        INTERFACE_INCLUDE_DIRECTORIES "${DTRAIN_GLOO_INCLUDE_DIR}")
endfunction()

# dtrain::nccl: NCCL's header and library. Looks in NCCL_ROOT, then next to the CUDA toolkit.
function(dtrain_find_nccl error_var)
  set(${error_var} "" PARENT_SCOPE)
  if(TARGET dtrain::nccl)
    return()
  endif()
  find_path(DTRAIN_NCCL_INCLUDE_DIR nccl.h
            HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}
                  /usr/local/cuda
            PATH_SUFFIXES include
            DOC "The directory holding NCCL's header (nccl.h)")
  # NAMES_PER_DIR: NCCL_ROOT's libnccl.so.2 (a wheel has no libnccl.so) before a system libnccl.so
  # whose version need not match the nccl.h found there.
  find_library(DTRAIN_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
               HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}
                     /usr/local/cuda
               PATH_SUFFIXES lib lib64
               DOC "NCCL's library (libnccl.so)")
  if(NOT DTRAIN_NCCL_INCLUDE_DIR OR NOT DTRAIN_NCCL_LIBRARY)
    string(CONCAT message
        "NCCL was not found (nccl.h: ${DTRAIN_NCCL_INCLUDE_DIR}, libnccl: ${DTRAIN_NCCL_LIBRARY}). "
        "Install NCCL's development files (NVIDIA's libnccl-dev) or set NCCL_ROOT to its prefix.")
    set(${error_var} "${message}" PARENT_SCOPE)
    return()
  endif()
  add_library(dtrain::nccl UNKNOWN IMPORTED ${ARGN})
  set_target_properties(dtrain::nccl PROPERTIES
                        IMPORTED_LOCATION "${DTRAIN_NCCL_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${DTRAIN_NCCL_INCLUDE_DIR}")
endfunction()

# dtrain::images: dtrain::dtrain plus OpenCV's core, imgcodecs and imgproc, for the programs that
# include <dtrain/data/image.hpp> or <dtrain/data/image_folder.hpp> (the rest of dtrain does not
# need OpenCV). Defined only where OpenCV is found; sets <found_var> to whether it is. Debian's
# LibTorch loads these OpenCV libraries already, so linking them adds no library at run time.
function(dtrain_find_opencv_images found_var)
  set(${found_var} OFF PARENT_SCOPE)
  if(TARGET dtrain::images)
    set(${found_var} ON PARENT_SCOPE)
    return()
  endif()
  find_package(OpenCV QUIET COMPONENTS core imgcodecs imgproc)
  if(NOT OpenCV_FOUND)
    return()
  endif()
  add_library(dtrain::images INTERFACE IMPORTED ${ARGN})
  set_target_properties(dtrain::images PROPERTIES
                        INTERFACE_INCLUDE_DIRECTORIES "${OpenCV_INCLUDE_DIRS}"
                        INTERFACE_LINK_LIBRARIES "dtrain::dtrain;opencv_core;opencv_imgcodecs;opencv_imgproc")
  set(${found_var} ON PARENT_SCOPE)
endfunction()
