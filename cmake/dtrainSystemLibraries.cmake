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

# dtrain::nccl: NCCL's header and library, those of the NCCL that LibTorch was built with. Looks in
# NCCL_ROOT, then where LibTorch's libtorch_cuda.so loads NCCL from (its RPATH/RUNPATH: a PyPI
# torch's is the nvidia-nccl wheel's site-packages/nvidia/nccl), then next to the CUDA toolkit.
# A CUDA toolkit's NCCL need not be LibTorch's: then libtorch_cuda.so imports NCCL functions it does
# not define (ncclCommGrow, ...), and every program would fail to link. So the library found must
# define every nccl* symbol libtorch_cuda.so imports (nm -D), and nccl.h must be of its release;
# otherwise <error_var> says so, naming NCCL_ROOT, and <error_var>_MISMATCH is set: a NCCL that is
# there but wrong fails the configuration even where the CUDA path is optional.
function(dtrain_find_nccl error_var)
  set(${error_var} "" PARENT_SCOPE)
  set(${error_var}_MISMATCH OFF PARENT_SCOPE)
  if(TARGET dtrain::nccl)
    return()
  endif()
  dtrain_torch_cuda_library(torch_cuda)
  set(torch_nccl "")
  if(torch_cuda)
    dtrain_torch_nccl_prefix("${torch_cuda}" torch_nccl)
  endif()
  find_path(DTRAIN_NCCL_INCLUDE_DIR nccl.h
            HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${torch_nccl} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}
                  /usr/local/cuda
            PATH_SUFFIXES include
            DOC "The directory holding NCCL's header (nccl.h)")
  # NAMES_PER_DIR: NCCL_ROOT's libnccl.so.2 (a wheel has no libnccl.so) before a system libnccl.so
  # whose version need not match the nccl.h found there.
  find_library(DTRAIN_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
               HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${torch_nccl} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}
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
  set(fix "Set NCCL_ROOT to the prefix of the NCCL this LibTorch was built with (PyPI's torch: the nvidia-nccl wheel's site-packages/nvidia/nccl, holding include/nccl.h and lib/libnccl.so.2) and reconfigure in a fresh build directory, or turn the CUDA path off with -DDTRAIN_CUDA=OFF.")
  # Every NCCL function libtorch_cuda.so imports, defined by the library found.
  if(torch_cuda AND CMAKE_NM)
    execute_process(COMMAND "${CMAKE_NM}" -D --undefined-only "${torch_cuda}" OUTPUT_VARIABLE imports
                    RESULT_VARIABLE imports_status ERROR_QUIET)
    execute_process(COMMAND "${CMAKE_NM}" -D --defined-only "${DTRAIN_NCCL_LIBRARY}" OUTPUT_VARIABLE exports
                    RESULT_VARIABLE exports_status ERROR_QUIET)
    if(imports_status EQUAL 0 AND exports_status EQUAL 0)
      string(REGEX MATCHALL " U nccl[A-Za-z0-9_]*" imported "${imports}")
      set(missing "")
      foreach(entry IN LISTS imported)
        string(REPLACE " U " "" symbol "${entry}")
        if(NOT exports MATCHES " ${symbol}(@[^\n]*)?\n")
          list(APPEND missing ${symbol})
        endif()
      endforeach()
      if(missing)
        list(LENGTH missing count)
        if(count GREATER 8)
          list(SUBLIST missing 0 8 missing)
          list(APPEND missing "... (${count} in all)")
        endif()
        list(JOIN missing ", " missing)
        string(CONCAT message
            "the NCCL found (${DTRAIN_NCCL_LIBRARY}) is not the one LibTorch was built with: LibTorch's "
            "${torch_cuda} imports NCCL functions that it does not define (${missing}), so every program "
            "would fail to link. ${fix}")
        set(${error_var} "${message}" PARENT_SCOPE)
        set(${error_var}_MISMATCH ON PARENT_SCOPE)
        return()
      endif()
    endif()
  endif()
  # nccl.h of the library's release, where the library's prefix has a header to compare with.
  get_filename_component(lib_prefix "${DTRAIN_NCCL_LIBRARY}" DIRECTORY)
  get_filename_component(lib_prefix "${lib_prefix}" DIRECTORY)
  dtrain_nccl_header_version("${DTRAIN_NCCL_INCLUDE_DIR}/nccl.h" header_version)
  dtrain_nccl_header_version("${lib_prefix}/include/nccl.h" library_version)
  if(header_version AND library_version AND NOT header_version VERSION_EQUAL library_version)
    string(CONCAT message
        "NCCL's header ${DTRAIN_NCCL_INCLUDE_DIR}/nccl.h is of NCCL ${header_version} but the library found, "
        "${DTRAIN_NCCL_LIBRARY}, is of NCCL ${library_version} (${lib_prefix}/include/nccl.h): the two must be "
        "one NCCL's. ${fix}")
    set(${error_var} "${message}" PARENT_SCOPE)
    set(${error_var}_MISMATCH ON PARENT_SCOPE)
    return()
  endif()
  add_library(dtrain::nccl UNKNOWN IMPORTED ${ARGN})
  set_target_properties(dtrain::nccl PROPERTIES
                        IMPORTED_LOCATION "${DTRAIN_NCCL_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${DTRAIN_NCCL_INCLUDE_DIR}")
endfunction()

# LibTorch's libtorch_cuda.so (beside TORCH_LIBRARY, or under TORCH_INSTALL_PREFIX), or "".
function(dtrain_torch_cuda_library out_var)
  set(dirs "")
  if(TORCH_LIBRARY)
    get_filename_component(dir "${TORCH_LIBRARY}" DIRECTORY)
    list(APPEND dirs "${dir}")
  endif()
  if(TORCH_INSTALL_PREFIX)
    list(APPEND dirs "${TORCH_INSTALL_PREFIX}/lib")
  endif()
  foreach(dir IN LISTS dirs)
    if(EXISTS "${dir}/libtorch_cuda.so")
      set(${out_var} "${dir}/libtorch_cuda.so" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out_var} "" PARENT_SCOPE)
endfunction()

# The prefix of the NCCL that `torch_cuda` loads through its own RPATH/RUNPATH (a directory there
# holding libnccl.so.2, whose parent holds include/nccl.h), or "".
function(dtrain_torch_nccl_prefix torch_cuda out_var)
  set(${out_var} "" PARENT_SCOPE)
  file(READ_ELF "${torch_cuda}" RPATH rpath RUNPATH runpath ERROR elf_error)
  get_filename_component(origin "${torch_cuda}" DIRECTORY)
  string(REPLACE ":" ";" dirs "${rpath}:${runpath}")
  foreach(dir IN LISTS dirs)
    string(REPLACE "$ORIGIN" "${origin}" dir "${dir}")
    if(dir AND EXISTS "${dir}/libnccl.so.2" AND EXISTS "${dir}/../include/nccl.h")
      get_filename_component(prefix "${dir}/.." ABSOLUTE)
      set(${out_var} "${prefix}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
endfunction()

# NCCL's release as nccl.h states it ("2.30.7"), or "" when there is no such file.
function(dtrain_nccl_header_version header out_var)
  set(${out_var} "" PARENT_SCOPE)
  if(NOT EXISTS "${header}")
    return()
  endif()
  file(STRINGS "${header}" defines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  set(parts "")
  foreach(part MAJOR MINOR PATCH)
    if(defines MATCHES "#define NCCL_${part} +([0-9]+)")
      list(APPEND parts ${CMAKE_MATCH_1})
    endif()
  endforeach()
  list(LENGTH parts count)
  if(count EQUAL 3)
    list(JOIN parts "." version)
    set(${out_var} "${version}" PARENT_SCOPE)
  endif()
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
