"""Programmatic dependent launch and the launch helpers every kernel family shares (and the
grouped tile order of the GEMMs).

A decode step is ~9 short kernels per layer, so the gap between two kernels is a large part
of it. With PDL (Hopper and later) a kernel is launched while its predecessor still runs; it
waits in pdl_enter() (griddepcontrol.wait: the predecessor has completed and its writes are
visible) before touching anything the predecessor may write, and then lets its own successor
launch. Invariant: every kernel launched with launch_pdl calls pdl_enter() unconditionally,
before its first read of a predecessor's output and before its first write, so a kernel
completes only after its predecessor did and ordering stays transitive along the stream."""

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@functools.lru_cache(maxsize=None)
def pdl() -> bool:
    """Whether the kernels launch with PDL: a Hopper or later GPU, not Triton's interpreter,
    and RTP_LLM_CUDA_PDL not 0."""
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("RTP_LLM_CUDA_PDL", "1") == "0":
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def launch_options() -> dict:
    return dict(PDL=True, launch_pdl=True) if pdl() else dict(PDL=False)


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n): the output tile of this program of a GEMM's 1-D grid, GROUP_M row tiles
    walked per column tile, so that programs running together share their weight tiles in L2."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = pid // per_group * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_m, (pid % per_group) // group_m


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """The device's streaming multiprocessors (1 off CUDA: Triton's interpreter runs one program
    at a time)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
