"""xgrammar's batch mask fill on a native thread that never takes Python's GIL.

mask_filler.py's thread fill releases the GIL inside xgrammar, but the thread still takes it to
start the call, to return, to open the device gate and to hand back its result: each a chance
for the engine thread's Python to wait for it (measured on the H200 host: the engine thread
blocked, not preempted, docs/serving_benchmarks.md sessions 17-19). Here the engine thread
packs the call's arguments and hands them to the core's FillWorker (rtp_llm/cpp/engine/
fill_worker.h), which calls xgrammar's method through tvm-ffi's public C ABI
(TVMFFIFunctionCall), then opens the gate with a store: no Python between submit and commit.

What it rests on (apache-tvm-ffi's c_api.h, the ABI xgrammar >= 0.2 binds with): a method of a
reflected object type is an ffi.Function, called as (self, *args) with each argument a 16-byte
TVMFFIAny {int32 type_index, uint32 0, 8-byte value}; the batch fill's arguments are the
BatchGrammarMatcher, an ffi.Array of the GrammarMatchers' handles, the mask as a DLTensor*, an
ffi.Array of row indices and a bool. Anything else (an xgrammar without those bindings) keeps
the thread fill, and the first native fill is checked against xgrammar's own Python call before
any is trusted (MaskFiller)."""

import ctypes
import logging
import os
from typing import Callable, List, Optional

import torch

log = logging.getLogger(__name__)

_DL_TENSOR_PTR, _BOOL, _ARRAY = 7, 2, 71  # tvm-ffi's static type indices (c_api.h: TVMFFITypeIndex)
_KDL_CPU, _KDL_INT = 1, 0  # DLPack: kDLCPU, kDLInt


class _Any(ctypes.Structure):
    _fields_ = [("type_index", ctypes.c_int32), ("zero", ctypes.c_uint32), ("value", ctypes.c_int64)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


def native_fill_enabled() -> bool:
    """RTP_LLM_GRAMMAR_NATIVE_FILL: 1 (default) fills on the native thread where xgrammar allows,
    0 on a Python thread (a diagnostic and a way back, measured in docs/serving_benchmarks.md)."""
    value = os.environ.get("RTP_LLM_GRAMMAR_NATIVE_FILL", "1")
    if value not in ("0", "1"):
        raise ValueError(f"RTP_LLM_GRAMMAR_NATIVE_FILL must be 0 or 1, got {value!r}")
    return value == "1"


class NativeBatchFill:
    """One BatchGrammarMatcher's batch fill, submitted to a FillWorker. Made by create()."""

    def __init__(self, lib, call: int, method, batch_handle, self_type: int):
        self._lib, self._call, self._method, self._batch = lib, call, method, batch_handle
        self._self_arg = _Any(self_type, 0, batch_handle.__chandle__())
        self._worker = lib.rtp_llm_fill_worker_create()
        self._keep = None  # what the call in flight reads (its Python owners), until wait()

    @classmethod
    def create(cls, batch) -> Optional["NativeBatchFill"]:
        """For xgrammar's BatchGrammarMatcher `batch`; None (logged) where its bindings or the
        library do not offer what this needs."""
        try:
            import tvm_ffi

            from rtp_llm.ops import ensure_engine_ops_loaded

            handle = batch._handle
            info = type(handle).__tvm_ffi_type_info__
            method = next(m.func for m in info.methods if m.name == "batch_fill_next_token_bitmask")
            call = ctypes.cast(ctypes.CDLL(tvm_ffi.libinfo.find_libtvm_ffi()).TVMFFIFunctionCall, ctypes.c_void_p)
            lib = _bind(ensure_engine_ops_loaded())
            return cls(lib, call.value, method, handle, info.type_index)
        except Exception as e:  # (an older or different xgrammar / tvm-ffi)
            log.info("grammar masks fill on a Python thread (no native fill here: %s: %s)", type(e).__name__, e)
            return None

    def submit(self, live: list, host: torch.Tensor, rows: List[int], gate, ticket: int) -> Callable[[], None]:
        """Starts filling host[rows[j]] ([G, W] int32, CPU, contiguous) from matcher live[j]; the
        worker opens `ticket` of `gate` (a HostGate with a counter_address(), or None) once done.
        Returns the fill's wait: it returns once the fill is done, raising if it failed."""
        import tvm_ffi

        matchers = tvm_ffi.convert([m._handle for m in live])
        indices = tvm_ffi.convert(list(rows))
        shape = (ctypes.c_int64 * 2)(*host.shape)
        tensor = _DLTensor(host.data_ptr(), _KDL_CPU, 0, 2, _KDL_INT, 32, 1, shape, None, 0)
        args = (_Any * 5)(self._self_arg, _Any(_ARRAY, 0, matchers.__chandle__()),
                          _Any(_DL_TENSOR_PTR, 0, ctypes.addressof(tensor)),
                          _Any(_ARRAY, 0, indices.__chandle__()), _Any(_BOOL, 0, 0))
        if self._keep is not None:  # a fill whose step failed before its commit waited for it
            self._lib.rtp_llm_fill_worker_wait(self._worker)
        counter = gate.counter_address() if gate is not None else None
        rc = self._lib.rtp_llm_fill_worker_submit(self._worker, self._call, self._method.__chandle__(), args, 5,
                                                  counter, ticket if counter else 0)
        if rc:
            raise RuntimeError(f"the native mask fill refused its call ({len(args)} arguments)")
        self._keep = (matchers, indices, shape, tensor, host, live)
        return self._wait

    def _wait(self):
        rc = self._lib.rtp_llm_fill_worker_wait(self._worker)  # (0 at once once waited for)
        self._keep = None
        if rc:
            raise RuntimeError(f"xgrammar's batch mask fill failed on the native thread (TVMFFIFunctionCall "
                               f"returned {rc}); RTP_LLM_GRAMMAR_NATIVE_FILL=0 fills on a Python thread, which "
                               f"raises xgrammar's own error")

    def close(self):
        if self._worker:
            self._lib.rtp_llm_fill_worker_destroy(self._worker)  # (waits for a call in flight)
            self._worker, self._keep = None, None


def _bind(lib):
    lib.rtp_llm_fill_worker_create.restype = ctypes.c_void_p
    lib.rtp_llm_fill_worker_create.argtypes = []
    lib.rtp_llm_fill_worker_destroy.argtypes = [ctypes.c_void_p]
    lib.rtp_llm_fill_worker_submit.restype = ctypes.c_int32
    lib.rtp_llm_fill_worker_submit.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                               ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64]
    lib.rtp_llm_fill_worker_wait.restype = ctypes.c_int32
    lib.rtp_llm_fill_worker_wait.argtypes = [ctypes.c_void_p]
    return lib
