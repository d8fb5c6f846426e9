"""Wraps the system gRPC/protobuf C++ (Debian: libgrpc++-dev, libprotobuf-dev,
protobuf-compiler-grpc) as @local_config_grpc.

Targets:
  :grpc++            cc_library linking the shared gRPC/protobuf/abseil libraries
                     (Debian's static archives are not PIC, so a shared core cannot use them)
  :protoc            the protobuf compiler
  :grpc_cpp_plugin   protoc plugin generating the C++ service stubs
  defs.bzl           GRPC_VERSION, PROTOBUF_VERSION
"""

load("//3rdparty:common.bzl", "config_fail")

_HINT = "apt-get install libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler pkg-config (scripts/bootstrap.sh does)"

_BUILD = """
package(default_visibility = ["//visibility:public"])

exports_files(["protoc", "grpc_cpp_plugin"])

cc_library(
    name = "grpc++",
    linkopts = {linkopts},
)
"""

def _tool(repository_ctx, tool):
    path = repository_ctx.which(tool)
    if not path:
        config_fail(repository_ctx.name, "`%s` not found on PATH: %s" % (tool, _HINT))
    return path

def _pkg_version(repository_ctx, pkg_config, module):
    result = repository_ctx.execute([pkg_config, "--modversion", module])
    if result.return_code != 0:
        config_fail(repository_ctx.name, "pkg-config does not know %s (%s): %s" % (module, result.stderr.strip(), _HINT))
    return result.stdout.strip()

def _grpc_configure_impl(repository_ctx):
    protoc = _tool(repository_ctx, "protoc")
    plugin = _tool(repository_ctx, "grpc_cpp_plugin")
    pkg_config = _tool(repository_ctx, "pkg-config")
    grpc_version = _pkg_version(repository_ctx, pkg_config, "grpc++")
    protobuf_version = _pkg_version(repository_ctx, pkg_config, "protobuf")

    # protoc must match the libprotobuf headers the generated code compiles against.
    protoc_version = repository_ctx.execute([protoc, "--version"]).stdout.strip().split(" ")[-1]
    if protoc_version.split(".")[-2:] != protobuf_version.split(".")[-2:]:
        config_fail(repository_ctx.name, "%s is version %s but libprotobuf is %s; generated code would not compile. Use the protoc of the same installation (%s)." % (protoc, protoc_version, protobuf_version, _HINT))

    repository_ctx.symlink(protoc, "protoc")
    repository_ctx.symlink(plugin, "grpc_cpp_plugin")
    # pkg-config's flags: abseil included, as the gRPC headers inline calls into it.
    libs = repository_ctx.execute([pkg_config, "--libs", "grpc++", "protobuf"])
    if libs.return_code != 0:
        config_fail(repository_ctx.name, "pkg-config --libs grpc++ protobuf failed: %s" % libs.stderr)
    flags = []
    for flag in [f for f in libs.stdout.strip().split(" ") if f] + ["-lpthread"]:
        if flag not in flags:
            flags.append(flag)
    repository_ctx.file("BUILD", _BUILD.format(linkopts = repr(flags)))
    repository_ctx.file("defs.bzl", "GRPC_VERSION = %r\nPROTOBUF_VERSION = %r\n" % (grpc_version, protobuf_version))

grpc_configure = repository_rule(
    implementation = _grpc_configure_impl,
    environ = ["PATH"],
    local = True,
)
