"""Detects torch in the configured Python (PYTHON_BIN_PATH) and generates @local_config_torch.

Targets:
  :torch    cc_library: torch headers (with the bundled pybind11), C++ ABI define, and link
            flags for libtorch/libc10/libtorch_python of that installation
  :target_has_torch  config_setting: the target CPU is the one torch was built for
  defs.bzl  TORCH_VERSION, TORCH_CXX11_ABI, TORCH_NPU_VERSION, TORCH_COMPATIBLE_WITH,
            TORCH_OPENMP_COPTS

Without torch the repository still loads (the C++ core needs no torch); building :torch then
fails with the fix. Torch-linked targets are compatible only with the CPU that installed
torch was built for (TORCH_COMPATIBLE_WITH), so cross builds skip them.
"""

load("//3rdparty:common.bzl", "PYTHON_BIN_PATH", "find_python", "run_python_json", "write_failing_target")

# torch is located and read, never imported: compiling and linking need only its files, while
# importing needs its runtime (the x86_64 PyPI build of torch 2.9 loads CUDA libraries from
# nvidia-* packages) and, where torch_npu is installed, CANN (torch_npu's autoload entry point).
_PROBE = """
import importlib.util, json, os, platform
info = {"error": None, "machine": platform.machine()}
try:
    from importlib import metadata
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise ImportError("No module named 'torch'")
    root = os.path.dirname(spec.origin)
    lib = os.path.join(root, "lib")
    with open(os.path.join(root, "version.py")) as f:
        version = [l.split("=", 1)[1].strip().strip("'\\"") for l in f if l.startswith("__version__")][0]
    with open(os.path.join(lib, "libc10.so"), "rb") as f:
        cxx11_abi = int(b"__cxx11" in f.read())  # std::__cxx11 appears in mangled names only then
    with open(os.path.join(root, "include", "ATen", "Config.h")) as f:
        # ATen's parallel_for is then inline OpenMP code (what torch.backends.openmp reports).
        openmp_build = "#define AT_PARALLEL_OPENMP 1" in f.read()
    info.update(
        version=version.split("+")[0],
        cxx11_abi=cxx11_abi,
        include=os.path.join(root, "include"),
        lib=lib,
        # The OpenMP runtime torch bundles (ATen's parallel_for is inline OpenMP code: an
        # extension must use torch's runtime, not a second one).
        openmp=sorted(f for f in os.listdir(lib) if f.startswith("libgomp")),
        openmp_build=openmp_build,
    )
    try:
        info["torch_npu"] = metadata.version("torch_npu")
    except metadata.PackageNotFoundError:
        info["torch_npu"] = None
except Exception as e:  # reported by the generated target, not here
    info["error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(info))
"""

_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "torch",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"], allow_empty = True),
    includes = ["include", "include/torch/csrc/api/include"],
    defines = ["_GLIBCXX_USE_CXX11_ABI={abi}"],
    linkopts = ["-L{lib}", "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10"{openmp}],
)
"""

_CPU_CONSTRAINTS = {
    "amd64": "@platforms//cpu:x86_64",
    "x86_64": "@platforms//cpu:x86_64",
    "aarch64": "@platforms//cpu:aarch64",
    "arm64": "@platforms//cpu:aarch64",
}

def _torch_configure_impl(repository_ctx):
    name = repository_ctx.name
    python = find_python(repository_ctx, name)
    info = run_python_json(repository_ctx, name, python, _PROBE)
    cpu = _CPU_CONSTRAINTS.get(info["machine"], "@platforms//:incompatible")
    if info["error"]:
        message = "[%s] torch is not installed for %s (%s). Install the pinned torch (pip install -r deps/requirements_cpu.txt; scripts/bootstrap.sh does) or point PYTHON_BIN_PATH at an interpreter that has it." % (name, python, info["error"])
        repository_ctx.file("BUILD", write_failing_target("torch_missing.h", message) + """
cc_library(name = "torch", hdrs = [":torch_missing.h"], visibility = ["//visibility:public"])
""")
        info = {"version": "", "cxx11_abi": 1, "torch_npu": None, "openmp_build": False}
    else:
        repository_ctx.symlink(info["include"], "include")
        openmp = ""
        if info["openmp_build"]:
            openmp = ', "-l:%s"' % info["openmp"][0] if info["openmp"] else ', "-lgomp"'
        repository_ctx.file("BUILD", _BUILD.format(abi = info["cxx11_abi"], lib = info["lib"], openmp = openmp))
    repository_ctx.file("BUILD", repository_ctx.read("BUILD") + """
config_setting(
    name = "target_has_torch",
    constraint_values = ["%s"],
    visibility = ["//visibility:public"],
)
""" % cpu)
    repository_ctx.file("defs.bzl", "\n".join([
        "TORCH_VERSION = %r" % info["version"],
        "TORCH_CXX11_ABI = %d" % info["cxx11_abi"],
        "TORCH_NPU_VERSION = %r" % (info["torch_npu"] or ""),
        "TORCH_COMPATIBLE_WITH = [%r]" % cpu,
        # Compile flags for code using ATen's parallel_for (see the probe's `openmp`).
        "TORCH_OPENMP_COPTS = %r" % (["-fopenmp"] if info["openmp_build"] else []),
        "",
    ]))

torch_configure = repository_rule(
    implementation = _torch_configure_impl,
    environ = [PYTHON_BIN_PATH, "PATH"],
    local = True,
)
