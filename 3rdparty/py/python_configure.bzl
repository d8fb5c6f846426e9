"""Detects the configured Python (PYTHON_BIN_PATH) and generates @local_config_python.

Targets:
  :python_headers      cc_library with Python.h of that interpreter
  :pybind11            pybind11 headers (torch's bundled copy when torch is installed)
  :python3             the interpreter, as an executable wrapper for build actions
  :grpc_python_protoc  `python -m grpc_tools.protoc` of that interpreter
  :py_toolchain        py_runtime_pair so that py_test runs with that interpreter
  defs.bzl             PYTHON_VERSION, PY_TAG, GLIBC_VERSION, GRPCIO_TOOLS_VERSION, PROTOBUF_REQUIREMENT
"""

load("//3rdparty:common.bzl", "PYTHON_BIN_PATH", "config_fail", "find_python", "run_python_json", "write_failing_target")

_PROBE = """
import importlib.util, json, os, platform, sys, sysconfig
info = {
    "version": "%d.%d" % sys.version_info[:2],
    "include": sysconfig.get_paths()["include"],
    "executable": sys.executable,
    "grpcio_tools": None,
    "protobuf_requirement": None,
    "pybind11_include": None,
    "glibc": platform.libc_ver()[1],
}
# torch extensions must use the pybind11 headers torch bundles (libtorch_python's ABI);
# the pybind11 package serves when torch is absent.
spec = importlib.util.find_spec("torch")
if spec and spec.origin:
    cand = os.path.join(os.path.dirname(spec.origin), "include")
    if os.path.exists(os.path.join(cand, "pybind11", "pybind11.h")):
        info["pybind11_include"] = cand
if info["pybind11_include"] is None:
    try:
        import pybind11
        info["pybind11_include"] = pybind11.get_include()
    except ImportError:
        pass
try:
    from importlib import metadata
    info["grpcio_tools"] = metadata.version("grpcio-tools")
    reqs = [r for r in (metadata.requires("grpcio-tools") or []) if r.replace(" ", "").startswith("protobuf")]
    info["protobuf_requirement"] = reqs[0].replace(" ", "") if reqs else None
except Exception:
    pass
print(json.dumps(info))
"""

_BUILD = """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

cc_library(
    name = "python_headers",
    hdrs = glob(["include/**/*.h"]),
    includes = ["include"],
)

sh_binary(
    name = "python3",
    srcs = ["python3.sh"],
)

sh_binary(
    name = "grpc_python_protoc",
    srcs = ["grpc_python_protoc.sh"],
)

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
    stub_shebang = "#!{python}",
)

py_runtime_pair(
    name = "py_runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "py_toolchain",
    toolchain = ":py_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

_PYBIND11_BUILD = """
cc_library(
    name = "pybind11",
    hdrs = glob(["pybind11_include/pybind11/**/*.h"]),
    includes = ["pybind11_include"],
)
"""

def _python_configure_impl(repository_ctx):
    name = repository_ctx.name
    python = find_python(repository_ctx, name)
    info = run_python_json(repository_ctx, name, python, _PROBE)
    include = repository_ctx.path(info["include"])
    if not include.get_child("Python.h").exists:
        config_fail(name, "Python.h not found in %s (interpreter %s): install the Python development headers (Debian: python%s-dev) or point %s at an interpreter that has them." % (include, python, info["version"], PYTHON_BIN_PATH))
    repository_ctx.symlink(include, "include")

    repository_ctx.file("python3.sh", '#!/bin/sh\nexec "%s" "$@"\n' % python, executable = True)
    if info["grpcio_tools"]:
        protoc = '#!/bin/sh\nexec "%s" -m grpc_tools.protoc "$@"\n' % python
    else:
        protoc = "#!/bin/sh\necho 'grpcio-tools is not installed for %s: pip install -r deps/requirements_build.txt (scripts/bootstrap.sh does).' >&2\nexit 1\n" % python
    repository_ctx.file("grpc_python_protoc.sh", protoc, executable = True)

    build = _BUILD.format(python = python)
    if info["pybind11_include"]:
        repository_ctx.symlink(info["pybind11_include"], "pybind11_include")
        build += _PYBIND11_BUILD
    else:
        build += write_failing_target("pybind11_missing.h", "[%s] pybind11 headers not found for %s: pip install -r deps/requirements_build.txt (scripts/bootstrap.sh does)." % (name, python))
        build += 'cc_library(name = "pybind11", hdrs = [":pybind11_missing.h"])\n'
    repository_ctx.file("BUILD", build)
    repository_ctx.file("defs.bzl", "\n".join([
        "PYTHON_BIN = %r" % python,
        "PYTHON_VERSION = %r" % info["version"],
        "GLIBC_VERSION = %r" % info["glibc"],
        "PY_TAG = %r" % ("cp" + info["version"].replace(".", "")),
        "GRPCIO_TOOLS_VERSION = %r" % (info["grpcio_tools"] or ""),
        "PROTOBUF_REQUIREMENT = %r" % (info["protobuf_requirement"] or ""),
        "",
    ]))

python_configure = repository_rule(
    implementation = _python_configure_impl,
    environ = [PYTHON_BIN_PATH, "PATH"],
    local = True,
)
