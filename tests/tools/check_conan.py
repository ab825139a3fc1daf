# SPDX-License-Identifier: Apache-2.0
"""`conan create` of dtrain's recipe, for real and offline (scripts/python-env's Conan 2).

    check_conan.py REPO WORKDIR [--separate-compilation]

Copies the recipe's sources (conanfile.py, LICENSE, CMakeLists.txt, cmake/, include/, src/,
test_package/) to WORKDIR/src, so that
test_package's build stays out of the checkout, and runs `conan create` there in a Conan home of its
own (WORKDIR/home) with no remote, under packaging/conan/debian-bookworm: LibTorch, Gloo, Boost,
range-v3, nlohmann_json and zlib are Debian's ([replace_requires] to Debian's versions, then
[platform_requires]). Checks: the package is created and in the cache, it holds the headers (with
their impl/*.ipp bodies) and the license, and nothing to link; with --separate-compilation
(`-o dtrain/*:separate_compilation=True`) libdtrain.a instead of the bodies; and test_package is
built against it and run (its line printed, saying which mode it was compiled in).
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tool_checks import check, finish  # noqa: E402

repo, workdir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
compiled = "--separate-compilation" in sys.argv[3:]
conan = os.path.join(os.path.dirname(sys.executable), "conan")
if not check(os.access(conan, os.X_OK), "conan is in %s (run scripts/python-env)" % os.path.dirname(conan)):
    finish()
shutil.rmtree(workdir, ignore_errors=True)
src, home = os.path.join(workdir, "src"), os.path.join(workdir, "home")
os.makedirs(src)
for name in ("conanfile.py", "LICENSE", "CMakeLists.txt"):
    shutil.copy(os.path.join(repo, name), src)
for name in ("cmake", "include", "src", "test_package"):
    shutil.copytree(os.path.join(repo, name), os.path.join(src, name),
                    ignore=shutil.ignore_patterns("build", "CMakeUserPresets.json"))
env = dict(os.environ, CONAN_HOME=home)


def conan_run(*args, timeout=900):
    p = subprocess.run([conan, *args], cwd=src, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout


print(conan_run("--version")[1].strip(), flush=True)
code, out = conan_run("remote", "remove", "*")
code, out = conan_run("remote", "list")
check(out.strip() == "", "no remote: nothing can be downloaded (%r)" % out.strip())
profile = os.path.join(repo, "packaging", "conan", "debian-bookworm")
options = []
if compiled:
    options = ["-o", "dtrain/*:separate_compilation=True"]
    # The library at -O1, as the suite's tests are (tests/CMakeLists.txt): this checks that the
    # recipe builds, packages and links it, not its speed; -O3 made this test 4 minutes of CI's 2
    # cores. Cached, so that CMake's own -O3 for Release does not replace it.
    extra = {"CMAKE_CXX_FLAGS_RELEASE": {"value": "-O1 -DNDEBUG", "cache": True, "type": "STRING"}}
    # The library's build goes through the machine's compiler cache, as dtrain's own build does.
    if shutil.which("ccache"):
        extra["CMAKE_CXX_COMPILER_LAUNCHER"] = "ccache"
    options += ["-c", "tools.cmake.cmaketoolchain:extra_variables=" + repr(extra)]  # a Python literal
code, out = conan_run("create", ".", "-pr:a", profile, *options)
sys.stdout.write(out[-6000:])
check(code == 0, "conan create exits 0")
line = "dtrain 0.1.0 (conan): 2 ranks cover 10 samples"
check(line in out, "test_package was built against the package and run")
check(("compiled library" in out) == compiled,
      "test_package says it linked the compiled library" if compiled else "test_package was compiled header-only")
for dep in ("libtorch/1.13.1", "boost/1.74.0", "range-v3/0.12.0", "nlohmann_json/3.11.2", "zlib/1.2.13"):
    check("%s - Platform" % dep in out, "%s is the platform's (Debian's)" % dep)
code, out = conan_run("list", "dtrain/0.1.0:*")
check(code == 0 and "dtrain/0.1.0" in out and "revisions" in out, "the package is in the cache")
code, out = conan_run("list", "dtrain/0.1.0:*", "--format=json")
ids = [pid for recipe in json.loads(out).get("Local Cache", {}).values() for rev in recipe.get("revisions", {}).values()
       for pid in rev.get("packages", {})] if code == 0 else []
check(len(ids) == 1, "one package of dtrain/0.1.0 in the cache (%s)" % ids)
code, out = conan_run("cache", "path", "dtrain/0.1.0:%s" % (ids[0] if ids else "none"))
package = out.strip()
check(code == 0 and os.path.isfile(os.path.join(package, "include", "dtrain", "dtrain.hpp"))
      and os.path.isfile(os.path.join(package, "include", "dtrain", "tracker", "tensorboard.hpp"))
      and os.path.isfile(os.path.join(package, "include", "dtrain", "tracking", "impl", "html.ipp"))
      and os.path.isfile(os.path.join(package, "licenses", "LICENSE")),
      "the package holds the headers and the license (%s)" % package)
if compiled:
    check(os.path.isfile(os.path.join(package, "lib", "libdtrain.a")), "the package holds libdtrain.a")
else:
    check(code == 0 and package and not os.path.exists(os.path.join(package, "lib")),
          "the package has nothing to link (header-only)")
finish()
