"""A HostGate on CUDA (device/base.py): the stream waits on a 64-bit counter in pinned host
memory (the driver's cuStreamWaitValue64, "greater or equal"), which the host raises with a
plain store. Queueing work behind such a wait lets the host launch it before the data it needs
exists (a grammar step's token mask, still being filled by xgrammar on another thread), so the
device goes from the step before straight to it once the host opens the gate, instead of
idling until the host has both filled the data and launched the work.

The store needs no device call and no lock: one thread opens tickets in order (the mask
filler's), the counter only goes up, and "greater or equal" lets a wait queued after a later
ticket was opened pass at once. The mask's bytes are written before the counter: the native fill
thread stores it with release order at counter_address() (fill_worker.h), a Python thread under
the GIL (a lock acquire and release), and x86 stores reach the device in program order anyway.

While a gate is closed, a kernel the driver has not loaded yet (CUDA loads them lazily: a new
Triton specialization, a cuBLAS kernel for a new shape) waits for the context's streams before it
loads, so the launching thread waits until the gate opens. The opener is another thread, and
torch's ops and Triton's loader release the GIL while they wait, so this delays, never deadlocks;
the engine's warm-up loads the steady state's kernels before any gate closes.

Tried and slower (docs/serving_benchmarks.md, session 15): the wait and the mask's upload on a
copy stream of their own, the compute stream waiting for it by event, so that the upload would
overlap the forward in flight: a schema step took twice as long. What does overlap it
(worker_copy, session 20): the native fill thread itself copies the filled mask on a stream that
holds nothing else, waits for that copy, then opens the gate, so no stream ever queues work
behind a closed gate but the compute stream's sampling, which then finds the mask on the device.

Driver entry points through ctypes (which releases the GIL for the call): torch exposes none.
"""

import ctypes
import logging
import os
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from rtp_llm.device.base import HostGate

log = logging.getLogger(__name__)

_WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ: (int64)(*addr - value) >= 0


class CudaHostGate(HostGate):
    def __init__(self, device: torch.device, wait_fn, dptr: int, flag: torch.Tensor):
        self._device = device
        self._wait_fn = wait_fn
        self._dptr = dptr
        self._flag = flag            # [1] int64, pinned: the counter the device reads
        self._value = flag.numpy()   # the same memory, stored to by open()
        self._last = 0
        self._copier: Optional[_WorkerCopy] = None  # worker_copy's, made at its first use

    @classmethod
    def create(cls, device: torch.device) -> Optional["CudaHostGate"]:
        """The gate, or None (logged) where the driver lacks 64-bit stream waits."""
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            wait_fn = next(getattr(lib, n) for n in ("cuStreamWaitValue64_v2", "cuStreamWaitValue64")
                           if hasattr(lib, n))
            wait_fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
            wait_fn.restype = ctypes.c_int
            to_device = lib.cuMemHostGetDevicePointer_v2
            to_device.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
            to_device.restype = ctypes.c_int
            flag = torch.zeros(1, dtype=torch.int64, pin_memory=True)
            dptr = ctypes.c_uint64(0)
            rc = to_device(ctypes.byref(dptr), ctypes.c_void_p(flag.data_ptr()), 0)
            if rc:
                raise RuntimeError(f"cuMemHostGetDevicePointer returned {rc}")
            gate = cls(device, wait_fn, dptr.value, flag)
            gate.wait(0)  # already open: checks the call works here
            torch.cuda.current_stream(device).synchronize()
            return gate
        except (OSError, StopIteration, AttributeError, RuntimeError) as e:
            log.warning("no host gate on this CUDA driver (%s): a grammar step's sampling waits for its mask "
                        "on the host", e)
            return None

    def next(self) -> int:
        self._last += 1
        return self._last

    def wait(self, ticket: int) -> None:
        stream = torch.cuda.current_stream(self._device).cuda_stream
        rc = self._wait_fn(ctypes.c_void_p(stream), self._dptr, ticket, _WAIT_GEQ)
        if rc:
            raise RuntimeError(f"cuStreamWaitValue64 returned CUresult {rc}")

    def open(self, ticket: int) -> None:
        self._value[0] = ticket

    def counter_address(self) -> int:
        return self._flag.data_ptr()

    # RTP_LLM_MASK_COPY_ON_WORKER=0: the mask is uploaded behind the gate, on the compute stream
    # (a diagnostic, measured in docs/serving_benchmarks.md)
    copies_on_worker = os.environ.get("RTP_LLM_MASK_COPY_ON_WORKER", "1") != "0"

    def worker_copy(self, host: torch.Tensor, dev: torch.Tensor) -> Sequence[Tuple[int, int, int, int]]:
        if self._copier is None:  # (first called on the engine thread, where torch's context is current)
            self._copier = _WorkerCopy(self._device)
        return self._copier.calls(host, dev)


class _WorkerCopy:
    """The driver calls a native thread makes to copy a mask to the device: make the context
    current on that thread, cuMemcpyHtoDAsync on a stream of its own, cuStreamSynchronize; each
    through the core's rtp_llm_fill_call_c_function. One set of argument records, rewritten per
    job (a job's calls run before the next job is packed)."""

    def __init__(self, device: torch.device):
        from rtp_llm.ops import ensure_engine_ops_loaded

        lib = ctypes.CDLL("libcuda.so.1")
        ctx = ctypes.c_void_p()
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        rc = lib.cuCtxGetCurrent(ctypes.byref(ctx))
        if rc or not ctx.value:
            raise RuntimeError(f"no current CUDA context for the mask's copy (cuCtxGetCurrent returned {rc})")
        self._stream = torch.cuda.Stream(device)
        self._call = _address(ensure_engine_ops_loaded().rtp_llm_fill_call_c_function)
        self._fns = [_address(lib.cuCtxSetCurrent), _address(lib.cuMemcpyHtoDAsync_v2),
                     _address(lib.cuStreamSynchronize)]
        self._args = np.zeros((3, 4), dtype=np.uint64)  # [call][arg]
        self._args[0, 0] = ctx.value
        self._args[1, 3] = self._args[2, 0] = self._stream.cuda_stream

    def calls(self, host: torch.Tensor, dev: torch.Tensor) -> Sequence[Tuple[int, int, int, int]]:
        if host.shape != dev.shape or not host.is_pinned() or not dev.is_contiguous():
            raise ValueError(f"a mask copy needs a pinned host tensor and a contiguous device one of its shape, "
                             f"got {tuple(host.shape)} and {tuple(dev.shape)}")
        self._args[1, :3] = dev.data_ptr(), host.data_ptr(), host.numel() * host.element_size()
        base, stride = self._args.ctypes.data, self._args.strides[0]
        return [(self._call, self._fns[0], base, 1), (self._call, self._fns[1], base + stride, 4),
                (self._call, self._fns[2], base + 2 * stride, 1)]


def _address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value
