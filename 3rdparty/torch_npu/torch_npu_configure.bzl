"""Detects torch_npu in the configured Python (PYTHON_BIN_PATH) and generates
@local_config_torch_npu, for --config=ascend.

Targets:
  :torch_npu   cc_library: torch_npu's C++ headers (c10_npu, ACL/HCCL/GE runtime headers) and
               the link flags of its libtorch_npu.so (RUNPATH is the linking target's business)
  :ascendcl, :acl_op_compiler, :hccl
               link-only stubs of the CANN libraries libascendcl.so, libacl_op_compiler.so
               and libhccl.so, so that a torch_npu extension links with -Wl,--no-undefined on
               a machine without CANN. This rule generates them (gen_stubs.py: one symbol per
               C function the wheel's headers declare, built with the host C compiler) into
               stubs/ of this repository and links them by path, as torch and torch_npu are
               linked: no Bazel runfiles, no RUNPATH entry, never bundled into the wheel, so
               never loaded; at run time CANN's set_env.sh puts the real ones on the library
               path. Depend only on those the code calls (each becomes NEEDED).
  defs.bzl     TORCH_NPU_VERSION ("" when torch_npu is not installed)

Nothing is imported: versions come from the installed distributions' metadata and the files
from the package directory, because importing torch_npu (or torch, through torch_npu's
autoload entry point) fails where CANN is absent, such as a build machine.

Only --config=ascend refers to this repository (arch_config/arch_select.bzl), so the default
build never fetches it. Without torch_npu it generates targets that fail, when built, with the
fix; an installed torch or torch_npu whose version differs from deps/requirements_ascend.txt
fails the fetch with the fix.
"""

load("//3rdparty:common.bzl", "PYTHON_BIN_PATH", "config_fail", "find_python", "run_python_json", "write_failing_target")

_PROBE = """
import importlib.util, json, os
from importlib import metadata
info = {}
for dist in ("torch", "torch_npu"):
    try:
        info[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        info[dist] = None
spec = importlib.util.find_spec("torch_npu")  # finds the package without importing it
info["root"] = os.path.dirname(spec.origin) if spec and spec.origin else None
print(json.dumps(info))
"""

# CANN libraries (SONAME -> headers under include/third_party/ declaring their C API) that
# libtorch_npu.so needs and an extension may call. libtorch_npu.so also needs libge_runner.so
# and libgraph.so, whose headers declare C++ classes only (GE graphs): nothing an extension
# may use, and nothing a shared-library link needs, so they get no stub.
_CANN_STUBS = {
    "libascendcl.so": [
        "acl/inc/acl/acl_base.h",
        "acl/inc/acl/acl_rt.h",
        "acl/inc/acl/acl_rt_allocator.h",
        "acl/inc/acl/acl_mdl.h",
        "acl/inc/acl/acl_op.h",
    ],
    "libacl_op_compiler.so": ["acl/inc/acl/acl_op_compiler.h"],
    "libhccl.so": ["hccl/inc/hccl/hccl.h"],
}

_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "torch_npu",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
    linkopts = ["-L{lib}", "-ltorch_npu"],
    deps = ["@local_config_torch//:torch"],
)

"""

_STUB = """
cc_library(
    name = "{name}",
    linkopts = ["{path}"],  # NEEDED: the stub's SONAME
)
"""

def _run(repository_ctx, args):
    result = repository_ctx.execute(args)
    if result.return_code != 0:
        config_fail(repository_ctx.name, "generating the CANN link stubs failed: `%s`:\n%s%s" % (" ".join([str(a) for a in args]), result.stdout, result.stderr))

def _target(soname):
    return soname[len("lib"):-len(".so")]

def _pin(repository_ctx, requirements, dist):
    """The version `dist==X` pins in the requirements file, or fails naming the file."""
    for line in repository_ctx.read(requirements).splitlines():
        line = line.split("#")[0].replace(" ", "")
        if line.startswith(dist + "=="):
            return line[len(dist) + 2:]
    config_fail(repository_ctx.name, "%s does not pin %s: add `%s==<version>` there (the single place the Ascend versions live)." % (requirements, dist, dist))
    return None

def _torch_npu_configure_impl(repository_ctx):
    name = repository_ctx.name
    requirements = repository_ctx.path(repository_ctx.attr.requirements)
    want_torch = _pin(repository_ctx, requirements, "torch")
    want_npu = _pin(repository_ctx, requirements, "torch_npu")
    python = find_python(repository_ctx, name)
    info = run_python_json(repository_ctx, name, python, _PROBE)
    fix = "scripts/build_ascend.sh makes such an environment and builds with it; by hand: `pip install --no-deps torch==%s torch_npu==%s` into the interpreter that PYTHON_BIN_PATH names (now %s), then `bazelisk sync --configure`." % (want_torch, want_npu, python)

    if not info["torch_npu"] or not info["root"]:
        message = "[%s] --config=ascend needs torch_npu==%s (%s), which %s does not have. %s" % (name, want_npu, requirements, python, fix)
        targets = ["torch_npu"] + [_target(soname) for soname in _CANN_STUBS]
        repository_ctx.file("BUILD", write_failing_target("torch_npu_missing.h", message) + "".join([
            'cc_library(name = "%s", hdrs = [":torch_npu_missing.h"], visibility = ["//visibility:public"])\n' % target
            for target in targets
        ]))
        repository_ctx.file("defs.bzl", 'TORCH_NPU_VERSION = ""\n')
        return

    if info["torch_npu"] != want_npu:
        config_fail(name, "%s has torch_npu %s, but %s pins torch_npu==%s. %s" % (python, info["torch_npu"], requirements, want_npu, fix))
    if (info["torch"] or "").split("+")[0] != want_torch:
        config_fail(name, "%s has torch %s, but torch_npu %s is built for torch==%s (%s). %s" % (python, info["torch"] or "(none)", want_npu, want_torch, requirements, fix))

    root = repository_ctx.path(info["root"])
    for required in ["include/torch_npu/csrc/core/npu/NPUStream.h", "include/third_party/acl/inc/acl/acl_rt.h", "lib/libtorch_npu.so"]:
        if not repository_ctx.path("%s/%s" % (root, required)).exists:
            config_fail(name, "%s/%s is missing: the torch_npu installation is incomplete; reinstall it (%s)." % (root, required, fix))
    repository_ctx.symlink(root.get_child("include"), "include")

    compiler = repository_ctx.os.environ.get("CC") or repository_ctx.which("gcc") or repository_ctx.which("cc")
    if not compiler:
        config_fail(name, "no C compiler for the CANN link stubs: install gcc (scripts/bootstrap.sh does) or set CC.")
    gen_stubs = repository_ctx.path(repository_ctx.attr._gen_stubs)
    build = _BUILD.format(lib = root.get_child("lib"))
    for soname, headers in _CANN_STUBS.items():
        source = "stubs/%s.c" % _target(soname)
        _run(repository_ctx, [python, str(gen_stubs), "--soname", soname, "--out", source] + [
            "%s/include/third_party/%s" % (root, h)
            for h in headers
        ])
        _run(repository_ctx, [str(compiler), "-shared", "-fPIC", "-w", "-fno-builtin", "-Wl,-soname," + soname, "-o", "stubs/" + soname, source])
        build += _STUB.format(name = _target(soname), path = repository_ctx.path("stubs/" + soname))
    repository_ctx.file("BUILD", build)
    repository_ctx.file("defs.bzl", "TORCH_NPU_VERSION = %r\n" % info["torch_npu"])

torch_npu_configure = repository_rule(
    implementation = _torch_npu_configure_impl,
    attrs = {
        "requirements": attr.label(default = "//deps:requirements_ascend.txt", allow_single_file = True),
        "_gen_stubs": attr.label(default = "//3rdparty/torch_npu:gen_stubs.py", allow_single_file = True),
    },
    environ = [PYTHON_BIN_PATH, "PATH", "CC"],
    local = True,
)
