"""CUDA C kernels compiled at run time with NVRTC (torch.cuda._compile_kernel) and launched the
way launch.py launches the Triton kernels: with programmatic dependent launch on Hopper and later,
so a kernel starts while its predecessor finishes. The contract is launch.py's: a kernel launched
with `pdl` executes griddepcontrol.wait before it reads anything a predecessor may write and before
its first write (it may read what no kernel writes, such as weights, earlier: that is the point).

torch's own launcher (cuLaunchKernel) takes no launch attributes, so the launch goes through the
driver's cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, which stream
capture records as a programmatic edge of the CUDA graph."""

import ctypes
import functools
from typing import Sequence

import torch

from rtp_llm.device.cuda.kernels.launch import pdl

_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID (cuda.h)


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, a 64-byte value union
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("value_pad", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


def kernel(source: str, name: str, defines: Sequence[str]):
    """`name` of `source` compiled with -D`defines` and loaded for the current device (NVRTC at first
    use only: a decode graph's eager warm-up compiles what its capture will launch)."""
    return _device_kernel(source, name, tuple(defines), torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _device_kernel(source: str, name: str, defines: tuple, device: int):
    return torch.cuda._compile_kernel(source, name, nvcc_options=[f"-D{d}" for d in defines])


@functools.lru_cache(maxsize=None)
def _launch_ex():
    """The driver's cuLaunchKernelEx, or None (a driver before CUDA 12: launches without PDL)."""
    fn = getattr(torch.cuda._utils._get_gpu_runtime_library(), "cuLaunchKernelEx", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def launch(compiled, grid: int, block: int, args: list, shared_mem: int = 0) -> None:
    """compiled<<<grid, block, shared_mem>>>(args) on the current stream (ints as C int, tensors as
    their data pointers); with PDL where launch.pdl() says so."""
    if not pdl() or _launch_ex() is None:
        compiled(grid=(grid, 1, 1), block=(block, 1, 1), args=args, shared_mem=shared_mem)
        return
    held = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int(a) for a in args]
    params = (ctypes.c_void_p * len(held))(*[ctypes.addressof(h) for h in held])
    attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
    cfg = _LaunchConfig(grid=(ctypes.c_uint * 3)(grid, 1, 1), block=(ctypes.c_uint * 3)(block, 1, 1),
                        shared_mem=shared_mem, stream=torch.cuda.current_stream().cuda_stream,
                        attrs=ctypes.pointer(attr), num_attrs=1)
    rc = _launch_ex()(ctypes.byref(cfg), compiled.func, params, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {rc}")


def local_bytes(compiled) -> int:
    """Local memory a thread of `compiled` uses (register spills and stack; 0 for a kernel that fits
    its registers)."""
    v = ctypes.c_int()
    lib = torch.cuda._utils._get_gpu_runtime_library()
    rc = lib.cuFuncGetAttribute(ctypes.byref(v), 3, compiled.func)  # CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
    if rc != 0:
        raise RuntimeError(f"cuFuncGetAttribute failed with CUresult {rc}")
    return v.value
