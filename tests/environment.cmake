# SPDX-License-Identifier: Apache-2.0
# Read by ctest before it runs any test (TEST_INCLUDE_FILES of the top-level directory): the
# environment every test process starts with, unless the caller's environment already says.
#
# scripts/test runs as many tests at once as there are cores, so a test process gets one core's share.
# Without these variables LibTorch's OpenMP pool and Debian's OpenBLAS pool take every core in
# each process, and OpenBLAS's pool threads spin (sched_yield) for about 0.1 s whenever they start
# or finish work: in a 2-worker scenario the driver's two pool threads spent 30% of the process's
# CPU time so, on the cores the other test needed. Each worker already runs with one thread of
# each (ScalingConfig::threads_per_worker, set by the driver); this gives the tests' own processes
# (drivers, Catch2 programs, the Python references) the same. docs/packaging.md has the figures.
#
# DTRAIN_PYTHON_FORKSERVER: tests/tools/venv-python runs the Python references as processes forked
# from one that has imported torch and transformers already (tests/tools/python_forkserver.py),
# which saves about 5 CPU seconds of imports in each of the suite's ~60 runs of them.
foreach(variable OMP_NUM_THREADS OPENBLAS_NUM_THREADS MKL_NUM_THREADS DTRAIN_PYTHON_FORKSERVER)
  if(NOT DEFINED ENV{${variable}})
    set(ENV{${variable}} 1)
  endif()
endforeach()
