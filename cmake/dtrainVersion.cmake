# SPDX-License-Identifier: Apache-2.0
# dtrain's version has one source, include/dtrain/version.hpp; this reads it for project().
#   dtrain_read_version(<header> <out_var>)   sets <out_var> to MAJOR.MINOR.PATCH
function(dtrain_read_version header out_var)
  file(STRINGS "${header}" lines REGEX "^#define DTRAIN_VERSION_(MAJOR|MINOR|PATCH) +[0-9]+ *$")
  set(version "")
  foreach(part MAJOR MINOR PATCH)
    if(NOT lines MATCHES "DTRAIN_VERSION_${part} +([0-9]+)")
      message(FATAL_ERROR "dtrain: ${header} has no line '#define DTRAIN_VERSION_${part} <number>'; "
                          "it is the one source of dtrain's version")
    endif()
    list(APPEND version "${CMAKE_MATCH_1}")
  endforeach()
  list(JOIN version "." version)
  set(${out_var} "${version}" PARENT_SCOPE)
endfunction()
