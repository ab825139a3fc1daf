#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""dtrain's configure finds the NCCL that LibTorch was built with, or fails naming NCCL_ROOT:

    check_nccl_choice.py SOURCE_DIR WORK_DIR CMAKE CXX

Configures dtrain (configure only: nothing is built) against the environment's PyPI torch (a CUDA
build) and the machine's CUDA toolkit:
- without NCCL_ROOT: the CUDA path is on with the nvidia-nccl wheel's library beside that torch
  (the toolkit's own NCCL, another release, lacks functions libtorch_cuda.so imports: every
  program would fail to link), or, where there is no such wheel, the configure fails naming NCCL_ROOT;
- with NCCL_ROOT at a NCCL that lacks those functions (one made here: a libnccl.so.2 that defines
  ncclGetVersion only): the configure fails, naming NCCL_ROOT and the missing functions;
- with NCCL_ROOT at the wheel's library under an nccl.h of another release: the configure fails.
Exits 77 (skipped) where torch has no CUDA or there is no CUDA toolkit.
"""
import os
import pathlib
import shutil
import subprocess
import sys


def fail(message, output=""):
    print(output[-6000:])
    print(f"FAIL {message}")
    sys.exit(1)


def configure(source, build, cmake, cuda_home, torch_prefix, torch_lib, extra):
    shutil.rmtree(build, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "NCCL_ROOT"}
    command = [cmake, "-S", source, "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
               f"-DCMAKE_PREFIX_PATH={torch_prefix}", f"-DTORCH_LIBRARY={torch_lib}/libtorch.so",
               f"-DCMAKE_CUDA_COMPILER={cuda_home}/bin/nvcc", "-DDTRAIN_BUILD_TESTS=OFF",
               "-DDTRAIN_BUILD_EXAMPLES=OFF", "-DDTRAIN_BUILD_BENCHMARKS=OFF", "-DDTRAIN_INSTALL=OFF", *extra]
    run = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # CMake wraps its messages' lines: join them back to search the text.
    return run.returncode, run.stdout, " ".join(run.stdout.split())


def fake_nccl(work, cxx, header_from, version):
    """A NCCL prefix: nccl.h saying `version`, and a libnccl.so.2 defining ncclGetVersion only."""
    prefix = work / f"nccl-{version}"
    (prefix / "include").mkdir(parents=True, exist_ok=True)
    (prefix / "lib").mkdir(exist_ok=True)
    major, minor, patch = version.split(".")
    text = header_from.read_text()
    for part, value in (("MAJOR", major), ("MINOR", minor), ("PATCH", patch)):
        lines = [f"#define NCCL_{part} {value}" if line.startswith(f"#define NCCL_{part} ") else line
                 for line in text.splitlines()]
        text = "\n".join(lines) + "\n"
    (prefix / "include" / "nccl.h").write_text(text)
    source = work / "fake_nccl.cpp"
    source.write_text('extern "C" int ncclGetVersion(int* v) { *v = 20000; return 0; }\n')
    subprocess.run([cxx, "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(prefix / "lib" / "libnccl.so.2"),
                    str(source)], check=True)
    return prefix


def main():
    source, work, cmake, cxx = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    import torch
    import torch.utils
    if not torch.version.cuda:
        print(f"SKIP torch {torch.__version__} has no CUDA")
        return 77
    cuda_home = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    if not (cuda_home / "bin" / "nvcc").exists():
        print(f"SKIP no CUDA toolkit at {cuda_home} (set CUDA_HOME)")
        return 77
    torch_prefix = torch.utils.cmake_prefix_path
    torch_lib = pathlib.Path(torch.__file__).parent / "lib"
    try:
        import nvidia.nccl
        wheel = pathlib.Path(list(nvidia.nccl.__path__)[0]).resolve()
    except ImportError:
        wheel = None
    work.mkdir(parents=True, exist_ok=True)
    args = (source, cmake, cuda_home, torch_prefix, torch_lib)

    rc, out, text = configure(source, work / "no_root", *args[1:], extra=[])
    if wheel:
        expected = f"dtrain: CUDA path on (NCCL: {wheel}/lib/libnccl.so.2)"
        if rc != 0 or expected not in text:
            fail(f"without NCCL_ROOT the configure should find the wheel's NCCL: no '{expected}'", out)
        print(f"without NCCL_ROOT: the wheel's NCCL, {wheel}/lib/libnccl.so.2")
    else:
        if rc == 0 or "NCCL_ROOT" not in text:
            fail("without NCCL_ROOT and without an nvidia-nccl wheel, the configure should fail naming NCCL_ROOT", out)
        print("without NCCL_ROOT and no wheel: the configure fails naming NCCL_ROOT")

    header = (wheel / "include" / "nccl.h") if wheel else (cuda_home / "include" / "nccl.h")
    if not header.exists():
        fail(f"no nccl.h at {header} to make a NCCL prefix from")
    fake = fake_nccl(work, cxx, header, "2.0.0")
    rc, out, text = configure(source, work / "fake_root", *args[1:], extra=[f"-DNCCL_ROOT={fake}"])
    for needle in ("NCCL_ROOT", "does not define", "ncclAllReduce", "fail to link"):
        if rc == 0 or needle not in text:
            fail(f"with NCCL_ROOT at a NCCL lacking LibTorch's functions the configure should fail saying '{needle}'", out)
    print("NCCL_ROOT at a NCCL lacking LibTorch's functions: the configure fails, naming them and NCCL_ROOT")

    if wheel:
        # The wheel's library, found by NCCL_ROOT, under a header of another release.
        rc, out, text = configure(source, work / "mixed_root", *args[1:],
                                  extra=[f"-DNCCL_ROOT={wheel}", f"-DDTRAIN_NCCL_INCLUDE_DIR={fake}/include"])
        if rc == 0 or "is of NCCL 2.0.0" not in text or "NCCL_ROOT" not in text:
            fail("an nccl.h of another release than the library should fail the configure, naming NCCL_ROOT", out)
        print("an nccl.h of another release than the library: the configure fails")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
