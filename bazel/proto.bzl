"""gRPC proto code generation with the system protoc (C++) and grpcio-tools (Python).

`grpc_proto_library(name, src)` defines:
  :<name>_cc  cc_library with <stem>.pb.{h,cc} and <stem>.grpc.pb.{h,cc}
  :<name>_py  py_library with <stem>_pb2.py and <stem>_pb2_grpc.py
Both are generated at the proto's own package path, so the Python stubs import as
`rtp_llm.<package path>.<stem>_pb2` from the source tree, runfiles and the wheel alike.
"""

def grpc_proto_library(name, src, visibility = None):
    stem = src[:-len(".proto")]
    cc_outs = [stem + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
    py_outs = [stem + "_pb2.py", stem + "_pb2_grpc.py"]

    native.genrule(
        name = name + "_cc_gen",
        srcs = [src],
        outs = cc_outs,
        tools = [
            "@local_config_grpc//:protoc",
            "@local_config_grpc//:grpc_cpp_plugin",
        ],
        cmd = " ".join([
            "$(location @local_config_grpc//:protoc)",
            "--plugin=protoc-gen-grpc=$(location @local_config_grpc//:grpc_cpp_plugin)",
            "--cpp_out=$(GENDIR)",
            "--grpc_out=$(GENDIR)",
            "-I.",
            "$(location %s)" % src,
        ]),
    )
    native.cc_library(
        name = name + "_cc",
        srcs = [stem + ".pb.cc", stem + ".grpc.pb.cc"],
        hdrs = [stem + ".pb.h", stem + ".grpc.pb.h"],
        deps = ["@local_config_grpc//:grpc++"],
        visibility = visibility,
    )

    native.genrule(
        name = name + "_py_gen",
        srcs = [src],
        outs = py_outs,
        tools = ["@local_config_python//:grpc_python_protoc"],
        cmd = " ".join([
            "$(location @local_config_python//:grpc_python_protoc)",
            "--python_out=$(GENDIR)",
            "--grpc_python_out=$(GENDIR)",
            "-I.",
            "$(location %s)" % src,
        ]),
    )
    native.py_library(
        name = name + "_py",
        srcs = py_outs,
        visibility = visibility,
    )
