"""A grammar step's matcher work on a native thread that never takes Python's GIL: each matcher
accepts the tokens its stream kept at the last commits, then xgrammar's batch mask fill.

mask_filler.py's thread fill releases the GIL inside xgrammar, but the thread still takes it to
start the call, to return, to open the device gate and to hand back its result: each a chance
for the engine thread's Python to wait for it; and the accepts, in the engine thread, held it
for a quarter of a 64-stream step's host time (measured on the H200 host,
docs/serving_benchmarks.md sessions 17-20). Here the engine thread packs the calls' arguments
and hands them to the core's FillWorker (rtp_llm/cpp/engine/fill_worker.h), which makes the
calls through tvm-ffi's public C ABI (TVMFFIFunctionCall), then opens the gate with a store:
no Python between submit and commit.

What it rests on (apache-tvm-ffi's c_api.h, the ABI xgrammar >= 0.2 binds with): a method of a
reflected object type is an ffi.Function, called as (self, *args) with each argument a 16-byte
TVMFFIAny {int32 type_index, uint32 0, 8-byte value}. GrammarMatcher.accept_token(self, int
token, bool debug_print) returns a bool; the batch fill's arguments are the BatchGrammarMatcher,
an ffi.Array of the GrammarMatchers' handles, the mask as a DLTensor*, an ffi.Array of row
indices and a bool, and it returns nothing. Anything else (an xgrammar without those bindings)
keeps the thread fill, and the first native job is checked against xgrammar's own Python calls
before any is trusted (MaskFiller)."""

import ctypes
import logging
import os
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch

log = logging.getLogger(__name__)

_INT, _BOOL, _DL_TENSOR_PTR, _ARRAY = 1, 2, 7, 71  # tvm-ffi's static type indices (c_api.h: TVMFFITypeIndex)
_KDL_CPU, _KDL_INT = 1, 0  # DLPack: kDLCPU, kDLInt
_ACCEPT_ARGS = 3  # accept_token's (self, token, debug_print)


class _Any(ctypes.Structure):
    _fields_ = [("type_index", ctypes.c_int32), ("zero", ctypes.c_uint32), ("value", ctypes.c_int64)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


def native_fill_enabled() -> bool:
    """RTP_LLM_GRAMMAR_NATIVE_FILL: 1 (default) runs the matchers' work on the native thread where
    xgrammar allows, 0 accepts in the engine thread and fills on a Python thread (a diagnostic and a
    way back, measured in docs/serving_benchmarks.md)."""
    value = os.environ.get("RTP_LLM_GRAMMAR_NATIVE_FILL", "1")
    if value not in ("0", "1"):
        raise ValueError(f"RTP_LLM_GRAMMAR_NATIVE_FILL must be 0 or 1, got {value!r}")
    return value == "1"


class _CallTable:
    """The job's call specs (the C ABI's RtpFillCallSpec: call, func, args, num_args, result; 40
    bytes each) for up to `cap` accepts, the fill after them and up to MAX_AFTER calls after
    that, with the accepts' argument records and every call's result record. Only the accepts'
    matcher and token change from job to job: the rest is written once here."""

    MAX_AFTER = 4

    def __init__(self, cap: int, call: int, accept_func: int, matcher_type: int):
        self.cap, self.accept = cap, (accept_func, matcher_type)
        rows = cap + 1 + self.MAX_AFTER
        self.args = np.zeros((cap, 2 * _ACCEPT_ARGS), dtype=np.int64)  # [accept][record: type, value]
        self.args[:, 0], self.args[:, 2], self.args[:, 4] = matcher_type, _INT, _BOOL
        self.results = np.zeros((rows, 2), dtype=np.int64)  # [call][type, value]
        self.template = np.zeros((rows, 5), dtype=np.int64)  # every row an accept's spec
        self.template[:, 0], self.template[:, 1] = call, accept_func
        self.template[:cap, 2] = self.args.ctypes.data + np.arange(cap) * self.args.strides[0]
        self.template[:, 3] = _ACCEPT_ARGS
        self.template[:, 4] = self.results.ctypes.data + np.arange(rows) * self.results.strides[0]
        self.specs = self.template.copy()

    def pack(self, handles: List[int], tokens: List[int], fill: tuple, after: Sequence[tuple]) -> int:
        """specs[0, n) accept tokens[i] into the matcher handles[i], specs[n] fills, the next ones
        make the calls `after`; fill and each of after: (call, func, args address, num_args).
        Returns how many specs there are."""
        n = len(handles)
        self.args[:n, 1], self.args[:n, 3] = handles, tokens
        self.specs[:n] = self.template[:n]
        for i, spec in enumerate((fill, *after)):
            self.specs[n + i, :4] = spec
        self.results[:n + 1 + len(after)] = 0
        return n + 1 + len(after)


class _FillCall:
    """xgrammar's batch fill of host[rows[j]] from matcher live[j], as a call spec, with what its
    arguments point to (tvm-ffi arrays of the matchers and rows, the mask's DLTensor) kept here."""

    def __init__(self, call: int, method, self_arg: "_Any", live: list, host: torch.Tensor, rows: List[int]):
        import tvm_ffi

        self.live, self.host, self.rows = list(live), host, list(rows)
        self._live = tvm_ffi.convert([m._handle for m in live])
        self._rows = tvm_ffi.convert(self.rows)
        self._shape = (ctypes.c_int64 * 2)(*host.shape)
        self._tensor = _DLTensor(host.data_ptr(), _KDL_CPU, 0, 2, _KDL_INT, 32, 1, self._shape, None, 0)
        self._args = (_Any * 5)(self_arg, _Any(_ARRAY, 0, self._live.__chandle__()),
                                _Any(_DL_TENSOR_PTR, 0, ctypes.addressof(self._tensor)),
                                _Any(_ARRAY, 0, self._rows.__chandle__()), _Any(_BOOL, 0, 0))
        self.spec = (call, method.__chandle__(), ctypes.addressof(self._args), len(self._args))

    def same(self, live: list, host: torch.Tensor, rows: List[int]) -> bool:
        return (host.data_ptr() == self.host.data_ptr() and host.shape == self.host.shape and rows == self.rows
                and len(live) == len(self.live) and all(a is b for a, b in zip(live, self.live)))


class NativeMatcherJob:
    """One BatchGrammarMatcher's accepts and batch fill, submitted to a FillWorker. Made by create()."""

    def __init__(self, lib, call: int, fill_method, batch_handle, batch_type: int):
        self._lib, self._call, self._fill, self._batch = lib, call, fill_method, batch_handle
        self._self_arg = _Any(batch_type, 0, batch_handle.__chandle__())
        self._worker = lib.rtp_llm_fill_worker_create()
        self._accept_fn = None  # GrammarMatcher.accept_token's ffi.Function, at the first accept
        self._accept = None  # (its handle, GrammarMatcher's type index): what the call table holds
        self._table: Optional[_CallTable] = None
        self._last_fill: Optional[_FillCall] = None
        self._keep = None  # what the job in flight reads (its Python owners), until wait()

    @classmethod
    def create(cls, batch) -> Optional["NativeMatcherJob"]:
        """For xgrammar's BatchGrammarMatcher `batch`; None (logged) where its bindings or the
        library do not offer what this needs."""
        try:
            import tvm_ffi

            from rtp_llm.ops import ensure_engine_ops_loaded

            handle = batch._handle
            info = type(handle).__tvm_ffi_type_info__
            method = _method(info, "batch_fill_next_token_bitmask")
            call = ctypes.cast(ctypes.CDLL(tvm_ffi.libinfo.find_libtvm_ffi()).TVMFFIFunctionCall, ctypes.c_void_p)
            lib = _bind(ensure_engine_ops_loaded())
            return cls(lib, call.value, method, handle, info.type_index)
        except Exception as e:  # (an older or different xgrammar / tvm-ffi)
            log.info("grammar masks fill on a Python thread (no native fill here: %s: %s)", type(e).__name__, e)
            return None

    def submit(self, matchers: list, tokens: List[int], live: list, host: torch.Tensor, rows: List[int], gate,
               ticket: int, after: Optional[Callable[[], Sequence[tuple]]] = None) -> Callable[[], np.ndarray]:
        """Starts: matchers[i] accepts tokens[i] (in order), then host[rows[j]] ([G, W] int32, CPU,
        contiguous) fills from matcher live[j], then the calls after() gives once no earlier job is
        in flight (RtpFillCallSpec's call, func, args address, num_args: the mask's copy to the
        device, HostGate.worker_copy); the worker opens `ticket` of `gate` (a HostGate with a
        counter_address(), or None) once done. Returns the job's wait: it returns once the job is
        done, with the indices i whose token its matcher rejected, raising if a call failed."""
        if self._keep is not None:  # a job whose step failed before its commit waited for it
            self._lib.rtp_llm_fill_worker_wait(self._worker, None)
            self._keep = None
        table = self._table_for(matchers)
        fill = self._fill_call(live, host, rows)
        n = table.pack([m._handle.__chandle__() for m in matchers], tokens, fill.spec, after() if after else ())
        counter = gate.counter_address() if gate is not None else None
        rc = self._lib.rtp_llm_fill_worker_submit(self._worker, table.specs.ctypes.data, n, counter,
                                                  ticket if counter else 0)
        if rc:
            raise RuntimeError(f"the native matcher job refused its {n} calls")
        self._keep = (table, fill, matchers)
        return lambda: self._wait(len(matchers))

    def _fill_call(self, live: list, host: torch.Tensor, rows: List[int]) -> "_FillCall":
        """The batch fill's call; the last one again where its matchers, mask and rows are (the
        steps of a steady batch: the same streams in the same rows)."""
        last = self._last_fill
        if last is None or not last.same(live, host, rows):
            last = self._last_fill = _FillCall(self._call, self._fill, self._self_arg, live, host, rows)
        return last

    def _table_for(self, matchers: list) -> _CallTable:
        if self._accept is None and matchers:  # (the matchers' type is known once there is one)
            info = type(matchers[0]._handle).__tvm_ffi_type_info__
            self._accept_fn = _method(info, "accept_token")
            self._accept = (self._accept_fn.__chandle__(), info.type_index)
        accept = self._accept or (0, 0)
        table = self._table
        if table is None or table.cap < len(matchers) or table.accept != accept:
            cap = max(64, len(matchers), 2 * table.cap if table is not None else 0)
            self._table = _CallTable(cap, self._call, *accept)
        return self._table

    def _wait(self, accepts: int) -> np.ndarray:
        failed_at = ctypes.c_int32(-1)
        rc = self._lib.rtp_llm_fill_worker_wait(self._worker, ctypes.byref(failed_at))  # (0 at once once waited for)
        table, self._keep = self._table, None
        if rc:
            what = (f"matcher {failed_at.value}'s accept_token" if 0 <= failed_at.value < accepts
                    else "xgrammar's batch mask fill" if failed_at.value == accepts
                    else f"the mask's copy to the device (call {failed_at.value - accepts} after the fill)")
            raise RuntimeError(f"{what} failed on the native thread (TVMFFIFunctionCall returned {rc}); "
                               f"RTP_LLM_GRAMMAR_NATIVE_FILL=0 runs it from Python, which raises xgrammar's own error")
        return np.flatnonzero(table.results[:accepts, 1] == 0)

    def close(self):
        if self._worker:
            self._lib.rtp_llm_fill_worker_destroy(self._worker)  # (waits for a job in flight)
            self._worker, self._keep = None, None


def _method(info, name: str):
    return next(m.func for m in info.methods if m.name == name)


def _bind(lib):
    lib.rtp_llm_fill_worker_create.restype = ctypes.c_void_p
    lib.rtp_llm_fill_worker_create.argtypes = []
    lib.rtp_llm_fill_worker_destroy.argtypes = [ctypes.c_void_p]
    lib.rtp_llm_fill_worker_submit.restype = ctypes.c_int32
    lib.rtp_llm_fill_worker_submit.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p,
                                               ctypes.c_int64]
    lib.rtp_llm_fill_worker_wait.restype = ctypes.c_int32
    lib.rtp_llm_fill_worker_wait.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return lib
