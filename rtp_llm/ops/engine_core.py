"""Python side of the engine core's C ABI (rtp_llm/cpp/api/engine_api.h), through ctypes.

EngineCore owns one engine. schedule() / schedule_ahead() return a StepBatch of numpy views
onto the core's preallocated buffers (zero copy): valid until the second schedule call after
it; copy what must outlive that.
"""

import ctypes
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2 as pb
from rtp_llm.ops import ensure_engine_ops_loaded

_i32p = ctypes.POINTER(ctypes.c_int32)
_i64p = ctypes.POINTER(ctypes.c_int64)
_f32p = ctypes.POINTER(ctypes.c_float)


class _Config(ctypes.Structure):
    _fields_ = [
        ("num_blocks", ctypes.c_int32),
        ("block_size", ctypes.c_int32),
        ("max_batch_size", ctypes.c_int32),
        ("max_num_batched_tokens", ctypes.c_int32),
        ("max_seq_len", ctypes.c_int32),
        ("enable_prefix_cache", ctypes.c_int32),
        ("eos_token_ids", _i32p),
        ("num_eos_token_ids", ctypes.c_int32),
    ]


# (name, pointer type, length: "S", "S+1", "T" or "SB") in RtpStepBatch order.
_BATCH_ARRAYS = [
    ("stream_ids", _i64p, "S"),
    ("query_lens", _i32p, "S"),
    ("prefix_lens", _i32p, "S"),
    ("context_lens", _i32p, "S"),
    ("query_starts", _i32p, "S+1"),
    ("do_sample", _i32p, "S"),
    ("block_tables", _i32p, "SB"),
    ("token_ids", _i32p, "T"),
    ("positions", _i32p, "T"),
    ("slot_mapping", _i64p, "T"),
    ("temperature", _f32p, "S"),
    ("top_k", _i32p, "S"),
    ("top_p", _f32p, "S"),
    ("min_p", _f32p, "S"),
    ("repetition_penalty", _f32p, "S"),
    ("presence_penalty", _f32p, "S"),
    ("frequency_penalty", _f32p, "S"),
    ("random_seed", _i64p, "S"),
    ("num_generated", _i32p, "S"),
    ("return_logprobs", _i32p, "S"),
]
_COUNTS = ["num_streams", "num_tokens", "num_sampled", "block_table_stride", "num_prefill"]


class _Batch(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in _COUNTS] + [(n, t) for n, t, _ in _BATCH_ARRAYS]


class _Stats(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_int32)
        for n in ["running", "waiting", "tracked_streams", "total_blocks", "free_blocks", "cached_blocks",
                  "used_blocks", "block_size"]
    ] + [(n, ctypes.c_int64) for n in ["hit_tokens", "lookup_tokens", "steps", "preemptions", "finished"]]


class EngineError(RuntimeError):
    """A request or call the core refused; `code` is upstream's ErrorCode number, `field` the
    request field it is about in the core's naming ("token_ids", a generate_config key; "")."""

    def __init__(self, code: int, message: str, field: str = ""):
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message
        self.field = field


@dataclass
class StepBatch:
    """One step (see rtp_llm/cpp/engine/step_batch.h). Arrays are views valid until the next
    schedule(): S = num_streams, T = num_tokens, B = block_table_stride."""

    num_streams: int
    num_tokens: int
    num_sampled: int
    block_table_stride: int
    num_prefill: int
    stream_ids: np.ndarray
    query_lens: np.ndarray
    prefix_lens: np.ndarray
    context_lens: np.ndarray
    query_starts: np.ndarray
    do_sample: np.ndarray
    block_tables: np.ndarray  # [S, B]
    token_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    min_p: np.ndarray
    repetition_penalty: np.ndarray
    presence_penalty: np.ndarray
    frequency_penalty: np.ndarray
    random_seed: np.ndarray
    num_generated: np.ndarray
    return_logprobs: np.ndarray


@dataclass
class DecodedOutput:
    """A GenerateOutputsPB (from poll() or the gRPC stream) as Python values."""

    token_ids: List[int]
    finished: bool
    logprobs: Optional[List[float]]  # of token_ids, when the request asked for them
    aux: dict                        # upstream's aux_info names; times in milliseconds
    finish_reason: Optional[str] = None  # "stop" | "length" once finished (as the core decided)
    error_field: str = ""                # the field error_info is about, when there is an error


def decode_output(out: pb.GenerateOutputsPB) -> DecodedOutput:
    flat = out.flatten_output
    ids = list(memoryview(flat.output_ids.int32_data).cast("i")) if flat.output_ids.int32_data else []
    a = flat.aux_info[0]
    logprobs = list(memoryview(a.logprobs.fp32_data).cast("f")) if a.logprobs.fp32_data else None
    aux = {
        "cost_time": a.cost_time_us / 1000.0, "first_token_cost_time": a.first_token_cost_time_us / 1000.0,
        "wait_time": a.wait_time_us / 1000.0, "iter_count": a.iter_count, "input_len": a.input_len,
        "prefix_len": a.prefix_len, "reuse_len": a.total_reuse_len, "output_len": a.output_len,
    }
    return DecodedOutput(ids, bool(flat.finished and flat.finished[0]), logprobs, aux, a.finish_reason or None,
                         out.error_info.field)


def _bind(lib):
    lib.rtp_llm_engine_create.restype = ctypes.c_void_p
    lib.rtp_llm_engine_create.argtypes = [ctypes.POINTER(_Config), ctypes.c_char_p, ctypes.c_int32]
    lib.rtp_llm_engine_destroy.argtypes = [ctypes.c_void_p]
    lib.rtp_llm_engine_enqueue.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32, _i64p,
                                           ctypes.c_char_p, ctypes.c_int32]
    for name in ("rtp_llm_engine_schedule", "rtp_llm_engine_schedule_ahead"):
        getattr(lib, name).restype = ctypes.POINTER(_Batch)
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    lib.rtp_llm_engine_commit.argtypes = [ctypes.c_void_p, _i32p, _f32p, ctypes.c_int32, ctypes.c_char_p,
                                          ctypes.c_int32]
    lib.rtp_llm_engine_fail_batch.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32]
    lib.rtp_llm_engine_wait_for_work.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rtp_llm_engine_stop.argtypes = [ctypes.c_void_p]
    lib.rtp_llm_engine_abort.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.rtp_llm_engine_poll.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p,
                                        ctypes.c_int32, _i32p]
    lib.rtp_llm_engine_stream_tokens.argtypes = [ctypes.c_void_p, ctypes.c_int64, _i32p, ctypes.c_int32, _i32p]
    lib.rtp_llm_engine_release.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.rtp_llm_engine_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Stats)]
    lib.rtp_llm_engine_start_rpc_server.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                                    ctypes.c_int32]
    lib.rtp_llm_engine_stop_rpc_server.argtypes = [ctypes.c_void_p]
    return lib


class EngineCore:
    def __init__(self, num_blocks: int, block_size: int, max_batch_size: int, max_num_batched_tokens: int,
                 max_seq_len: int, enable_prefix_cache: bool = True, eos_token_ids: Sequence[int] = ()):
        self._lib = _bind(ensure_engine_ops_loaded())
        self._eos = (ctypes.c_int32 * max(len(eos_token_ids), 1))(*eos_token_ids)
        config = _Config(num_blocks, block_size, max_batch_size, max_num_batched_tokens, max_seq_len,
                         int(enable_prefix_cache), self._eos, len(eos_token_ids))
        err = ctypes.create_string_buffer(512)
        self._handle = self._lib.rtp_llm_engine_create(ctypes.byref(config), err, len(err))
        if not self._handle:
            raise ValueError(f"invalid engine config: {err.value.decode()}")
        self.block_size = block_size
        self.max_seq_len = max_seq_len
        self._max_streams = max_batch_size
        self._max_tokens = max_num_batched_tokens
        self._max_blocks = -(-max_seq_len // block_size)
        self._err = ctypes.create_string_buffer(512)
        self._poll_buf = ctypes.create_string_buffer(1 << 16)
        self._views: dict = {}  # address of a batch buffer -> its arrays, mapped at full size
        self._empty = StepBatch(0, 0, 0, 0, 0, **{name: np.zeros(0, dtype=np.dtype(t._type_))
                                                   for name, t, _ in _BATCH_ARRAYS})
        self._empty.block_tables = self._empty.block_tables.reshape(0, 0)

    def close(self):
        if self._handle:
            self._lib.rtp_llm_engine_destroy(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    def enqueue(self, token_ids: Sequence[int], generate_config: pb.GenerateConfigPB, request_id: int = 0) -> int:
        request = pb.GenerateInputPB(request_id=request_id, token_ids=list(token_ids))
        request.generate_config.CopyFrom(generate_config)
        data = request.SerializeToString()
        stream_id = ctypes.c_int64()
        code = self._lib.rtp_llm_engine_enqueue(self._handle, data, len(data), ctypes.byref(stream_id), self._err,
                                                len(self._err))
        if code != 0:
            raise EngineError(code, self._err.value.decode())
        return stream_id.value

    def schedule(self) -> StepBatch:
        """The next step; while one is uncommitted, that one again."""
        return self._batch(self._lib.rtp_llm_engine_schedule(self._handle).contents)

    def schedule_ahead(self) -> StepBatch:
        """The step after the uncommitted one, before its tokens are known: a token id -1 - r
        stands for row r of the tokens that step samples (see rtp_llm/cpp/engine/scheduler.h).
        With nothing uncommitted, schedule(); with two, an empty batch."""
        return self._batch(self._lib.rtp_llm_engine_schedule_ahead(self._handle).contents)

    def _batch(self, b) -> StepBatch:
        if b.num_streams == 0:
            return self._empty
        key = ctypes.cast(b.stream_ids, ctypes.c_void_p).value
        v = self._views.get(key)
        if v is None:  # the core's buffers never move: map each once, at full size
            v = self._views[key] = self._map(b)
        s, t, stride = b.num_streams, b.num_tokens, b.block_table_stride
        arrays = {}
        for name, _, kind in _BATCH_ARRAYS:
            if kind == "S":
                arrays[name] = v[name][:s]
            elif kind == "S+1":
                arrays[name] = v[name][: s + 1]
            elif kind == "T":
                arrays[name] = v[name][:t]
            else:
                arrays[name] = v[name][: s * stride].reshape(s, stride)
        return StepBatch(s, t, b.num_sampled, stride, b.num_prefill, **arrays)

    def _map(self, b) -> dict:
        # Capacities: the largest batch the config allows (see StepBatch::reserve).
        cap = {"S": self._max_streams, "S+1": self._max_streams + 1, "T": self._max_tokens,
               "SB": self._max_streams * self._max_blocks}
        return {name: np.ctypeslib.as_array(getattr(b, name), shape=(cap[kind],)) for name, _, kind in _BATCH_ARRAYS}

    def commit(self, tokens: np.ndarray, logprobs: Optional[np.ndarray] = None):
        """The sampled tokens of the oldest uncommitted batch (its do_sample streams, in order)."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        lp = None
        if logprobs is not None:
            lp = np.ascontiguousarray(logprobs, dtype=np.float32).ctypes.data_as(_f32p)
        code = self._lib.rtp_llm_engine_commit(self._handle, tokens.ctypes.data_as(_i32p), lp, len(tokens), self._err,
                                               len(self._err))
        if code != 0:
            raise EngineError(code, self._err.value.decode())

    def fail_batch(self, message: str):
        """Instead of commit(): the streams of every uncommitted batch end with
        EXECUTION_EXCEPTION (606)."""
        code = self._lib.rtp_llm_engine_fail_batch(self._handle, message.encode(), self._err, len(self._err))
        if code != 0:
            raise EngineError(code, self._err.value.decode())

    def wait_for_work(self, timeout_ms: int) -> bool:
        return bool(self._lib.rtp_llm_engine_wait_for_work(self._handle, timeout_ms))

    def stop(self):
        self._lib.rtp_llm_engine_stop(self._handle)

    def abort(self, stream_id: int) -> bool:
        return bool(self._lib.rtp_llm_engine_abort(self._handle, stream_id))

    def poll(self, stream_id: int, start: int = 0):
        """(GenerateOutputsPB with tokens generated from `start` on, upstream error code or 0)."""
        code = ctypes.c_int32()
        while True:
            n = self._lib.rtp_llm_engine_poll(self._handle, stream_id, start, self._poll_buf, len(self._poll_buf),
                                              ctypes.byref(code))
            if n < 0:
                raise KeyError(f"unknown stream {stream_id}")
            if n <= len(self._poll_buf):
                break
            # Too small: n is the size needed now; the stream may grow again before the retry.
            self._poll_buf = ctypes.create_string_buffer(n * 2)
        return pb.GenerateOutputsPB.FromString(self._poll_buf.raw[:n]), code.value

    def stream_tokens(self, stream_id: int):
        """(all tokens of the stream as int32 numpy, prompt length)."""
        prompt_len = ctypes.c_int32()
        n = self._lib.rtp_llm_engine_stream_tokens(self._handle, stream_id, None, 0, ctypes.byref(prompt_len))
        if n < 0:
            raise KeyError(f"unknown stream {stream_id}")
        out = np.empty(n, dtype=np.int32)
        self._lib.rtp_llm_engine_stream_tokens(self._handle, stream_id, out.ctypes.data_as(_i32p), n,
                                               ctypes.byref(prompt_len))
        return out, prompt_len.value

    def release(self, stream_id: int):
        self._lib.rtp_llm_engine_release(self._handle, stream_id)

    def stats(self) -> dict:
        s = _Stats()
        self._lib.rtp_llm_engine_stats(self._handle, ctypes.byref(s))
        return {name: getattr(s, name) for name, _ in _Stats._fields_}

    def start_rpc_server(self, address: str) -> int:
        port = self._lib.rtp_llm_engine_start_rpc_server(self._handle, address.encode(), self._err, len(self._err))
        if port < 0:
            raise OSError(self._err.value.decode())
        return port

    def stop_rpc_server(self):
        self._lib.rtp_llm_engine_stop_rpc_server(self._handle)
