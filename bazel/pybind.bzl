"""Local stand-in for pybind11_bazel's `pybind_extension` (same name and arguments).

`pybind_extension(name = "foo", ...)` builds the Python module `foo.so`; the module name in
PYBIND11_MODULE must equal `foo` (the .so stem). Code linked in through `deps` must be
`alwayslink = True`, or the module's init symbol is dropped. Switching to the real
pybind11_bazel later only changes the load() line."""

PYBIND_COPTS = ["-fvisibility=hidden", "-fexceptions"]

def pybind_extension(name, srcs = [], deps = [], copts = [], linkopts = [], **kwargs):
    native.cc_binary(
        name = name + ".so",
        srcs = srcs,
        copts = PYBIND_COPTS + copts,
        linkopts = linkopts,
        linkshared = True,
        linkstatic = True,
        deps = deps + [
            "@local_config_python//:pybind11",
            "@local_config_python//:python_headers",
        ],
        **kwargs
    )
