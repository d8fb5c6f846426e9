"""select() helpers: device x arch -> requirement set, compatibility, wheel platform.

The device comes from --config=cuda / --config=ascend (default: cpu)."""

load("@local_config_torch//:defs.bzl", "TORCH_COMPATIBLE_WITH")

def requirements_file():
    """The runtime requirement set (the wheel's Requires-Dist) of the selected device."""
    return select({
        "//arch_config:device_cuda": "//deps:requirements_cuda.txt",
        "//arch_config:device_ascend": "//deps:requirements_ascend.txt",
        "//conditions:default": "//deps:requirements_cpu.txt",
    })

def torch_compatible_with():
    """target_compatible_with for torch-linked targets: only the CPU the configured torch was
    built for, so cross builds (--config=aarch64 on x86_64) skip them instead of failing."""
    return TORCH_COMPATIBLE_WITH

def if_torch_target(then, otherwise = []):
    """`then` when the target CPU can load the configured torch, else `otherwise`."""
    return select({
        "@local_config_torch//:target_has_torch": then,
        "//conditions:default": otherwise,
    })

def wheel_platform(glibc):
    """The wheel's platform tag for the target CPU; glibc is the build machine's version."""
    tag = "manylinux_" + glibc.replace(".", "_")
    return select({
        "//arch_config:cpu_aarch64": tag + "_aarch64",
        "//conditions:default": tag + "_x86_64",
    })
