"""C++ cross toolchain for linux/aarch64 from Debian's g++-aarch64-linux-gnu.

The compiler is reached through wrappers found on PATH, so no host path is written here
except the Debian cross layout that the builtin include check must know."""

load("@bazel_tools//tools/build_defs/cc:action_names.bzl", "ACTION_NAMES")
load("@bazel_tools//tools/cpp:cc_toolchain_config_lib.bzl", "feature", "flag_group", "flag_set", "tool_path")

_COMPILE = [
    ACTION_NAMES.c_compile,
    ACTION_NAMES.cpp_compile,
    ACTION_NAMES.cpp_header_parsing,
    ACTION_NAMES.cpp_module_compile,
    ACTION_NAMES.assemble,
    ACTION_NAMES.preprocess_assemble,
]
_LINK = [
    ACTION_NAMES.cpp_link_executable,
    ACTION_NAMES.cpp_link_dynamic_library,
    ACTION_NAMES.cpp_link_nodeps_dynamic_library,
]

def _impl(ctx):
    tools = {
        "gcc": "gcc.sh",
        "cpp": "gcc.sh",
        "ld": "ld.sh",
        "ar": "ar.sh",
        "nm": "nm.sh",
        "objdump": "objdump.sh",
        "strip": "strip.sh",
        "gcov": "/bin/false",
    }
    features = [
        feature(name = "supports_pic", enabled = True),
        feature(name = "supports_dynamic_linker", enabled = True),
        feature(name = "opt"),
        feature(name = "dbg"),
        feature(
            name = "default_flags",
            enabled = True,
            flag_sets = [
                flag_set(actions = _COMPILE, flag_groups = [flag_group(flags = [
                    "-fstack-protector",
                    "-fno-omit-frame-pointer",
                    "-fno-canonical-system-headers",
                    "-Wno-builtin-macro-redefined",
                    "-D__DATE__=\"redacted\"",
                    "-D__TIMESTAMP__=\"redacted\"",
                    "-D__TIME__=\"redacted\"",
                ])]),
                flag_set(actions = _COMPILE, flag_groups = [flag_group(flags = ["-g0", "-O2", "-DNDEBUG", "-ffunction-sections", "-fdata-sections"])]),
                flag_set(actions = _LINK, flag_groups = [flag_group(flags = ["-lstdc++", "-lm", "-pthread", "-Wl,-z,relro,-z,now"])]),
            ],
        ),
    ]
    return cc_common.create_cc_toolchain_config_info(
        ctx = ctx,
        features = features,
        cxx_builtin_include_directories = [
            "/usr/lib/gcc-cross/aarch64-linux-gnu",
            "/usr/aarch64-linux-gnu/include",
            "/usr/include",
        ],
        toolchain_identifier = "linux_aarch64_gcc",
        host_system_name = "x86_64-unknown-linux-gnu",
        target_system_name = "aarch64-unknown-linux-gnu",
        target_cpu = "aarch64",
        target_libc = "glibc",
        compiler = "gcc",
        abi_version = "gcc",
        abi_libc_version = "glibc",
        tool_paths = [tool_path(name = k, path = v) for k, v in tools.items()],
    )

cc_toolchain_config = rule(
    implementation = _impl,
    attrs = {},
    provides = [CcToolchainConfigInfo],
)
