"""Python side of the engine core's C ABI (rtp_llm/cpp/api/engine_api.h), through ctypes.

EngineCore owns one engine. schedule() / schedule_ahead() return a StepBatch of numpy views
onto the core's preallocated buffers (zero copy): valid until the second schedule call after
it; copy what must outlive that.
"""

import ctypes
import functools
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2 as pb
from rtp_llm.ops import NativeLibraryError, ensure_engine_ops_loaded, kv_handoff
from rtp_llm.ops.draft_rows import with_draft_positions

_i32p = ctypes.POINTER(ctypes.c_int32)
_i64p = ctypes.POINTER(ctypes.c_int64)
_f32p = ctypes.POINTER(ctypes.c_float)

# engine_api.h's codes (RTP_LLM_TYPE_*, RTP_LLM_LEN_*, RTP_LLM_GROUP_*).
_CTYPES = {1: ctypes.c_int32, 2: ctypes.c_int64, 3: ctypes.c_float}
SCALAR, LEN_S, LEN_S1, LEN_T, LEN_SB, LEN_H, LEN_EOS, LEN_L = range(8)
GROUP_HOST, GROUP_MODEL, GROUP_SAMPLE, GROUP_PARAM = 1, 2, 3, 4


class _FieldInfo(ctypes.Structure):  # RtpFieldInfo: the description's own layout, fixed by the ABI version
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_int32), ("length", ctypes.c_int32),
                ("group", ctypes.c_int32), ("lo_open", ctypes.c_int32), ("offset", ctypes.c_int64),
                ("default_value", ctypes.c_double), ("lo", ctypes.c_double), ("hi", ctypes.c_double)]


class _StructInfo(ctypes.Structure):  # RtpStructInfo
    _fields_ = [("size", ctypes.c_int64), ("num_fields", ctypes.c_int32), ("fields", ctypes.POINTER(_FieldInfo))]


@dataclass(frozen=True)
class Field:
    """One field of a C ABI struct as the library describes it (rtp_llm_struct_info)."""

    name: str
    ctype: type     # element type (of the array, for pointer fields)
    length: int     # SCALAR, or the array's length kind (LEN_*)
    group: int      # step arrays: GROUP_*
    offset: int     # offsetof in the C struct
    default: float  # sampling parameters and engine config: default and range
    lo: float
    lo_open: bool
    hi: float

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.ctype)


def describe(lib, name: str) -> Tuple[int, List[Field]]:
    """(sizeof, fields in declaration order) of the C struct `name`, from the library."""
    lib.rtp_llm_struct_info.restype = ctypes.POINTER(_StructInfo)
    lib.rtp_llm_struct_info.argtypes = [ctypes.c_char_p]
    info = lib.rtp_llm_struct_info(name.encode())
    if not info:
        raise NativeLibraryError(f"the engine library does not describe {name}")
    info = info.contents
    fields = [Field(f.name.decode(), _CTYPES[f.type], f.length, f.group, f.offset, f.default_value, f.lo,
                    bool(f.lo_open), f.hi) for f in info.fields[:info.num_fields]]
    return info.size, fields


def mirror(lib, name: str) -> Tuple[type, List[Field]]:
    """A ctypes Structure built from the C description of `name` (names and types only), checked
    against it: ctypes lays it out on its own, so a size or offset that differs from the C
    compiler's raises NativeLibraryError."""
    size, fields = describe(lib, name)
    members = [(f.name, ctypes.POINTER(f.ctype) if f.length != SCALAR else f.ctype) for f in fields]
    struct = type(name, (ctypes.Structure,), {"_fields_": members})
    bad = [f"{f.name} at {getattr(struct, f.name).offset} (C: {f.offset})" for f in fields
           if getattr(struct, f.name).offset != f.offset]
    if ctypes.sizeof(struct) != size or bad:
        raise NativeLibraryError(f"{name}: ctypes lays it out as {ctypes.sizeof(struct)} bytes, C as {size}"
                                 + (f"; fields {', '.join(bad)}" if bad else ""))
    return struct, fields


@functools.lru_cache(maxsize=None)
def _abi():
    """The loaded library with its structs mirrored: (lib, {name: (ctypes struct, fields)})."""
    lib = ensure_engine_ops_loaded()
    structs = {name: mirror(lib, name) for name in ("RtpEngineConfig", "RtpStepBatch", "RtpEngineStats")}
    return _bind(lib, structs), structs


class EngineError(RuntimeError):
    """A request or call the core refused; `code` is upstream's ErrorCode number, `field` the
    request field it is about in the core's naming ("token_ids", a generate_config key; "")."""

    def __init__(self, code: int, message: str, field: str = ""):
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message
        self.field = field


def step_batch_fields() -> List[Field]:
    """RtpStepBatch's fields: counts (SCALAR), then arrays, then sampling parameters."""
    return _abi()[1]["RtpStepBatch"][1]


def used_lengths(b) -> Dict[int, int]:
    """Each array length kind's size in the step with counts `b` (num_streams, ...)."""
    s = b.num_streams
    return {LEN_S: s, LEN_S1: s + 1, LEN_T: b.num_tokens, LEN_SB: s * b.block_table_stride,
            LEN_H: b.num_history_tokens, LEN_L: b.num_bias_entries}


class SamplingRows(SimpleNamespace):
    """The sampler's rows: every SAMPLE and PARAM array of a step batch (step_batch_fields.h),
    [S] arrays masked to the rows sampled ([N]), history_tokens [H] whole. In a step with drafts
    also draft_tokens [N] int32, and each row's num_generated and penalty history count the
    drafts before it (ops/draft_rows.py); else draft_tokens is None."""

    draft_tokens = None
    draft_values = None  # (ops/draft_rows.py)


class StepBatch:
    """One step: its counts (num_streams, ...) and arrays (stream_ids, ...) as attributes, named
    and sized as in rtp_llm/cpp/engine/step_batch_fields.h; block_tables is [S, B]. The arrays
    are views valid until the second schedule call after it."""

    def __init__(self, row_spec: Tuple[Tuple[str, bool], ...], counts: Dict[str, int],
                 arrays: Dict[str, np.ndarray]):
        self._row_spec = row_spec  # the sampler's arrays: (name, masked: an [S] array) (rows_spec)
        self.__dict__.update(counts)
        self.__dict__.update(arrays)

    def sampled_streams(self) -> np.ndarray:
        """The stream of each sampled row, in commit order: a boolean [S] mask (one row per do_sample
        stream) or, in a step with drafts, an int index [N] (1 + draft_lens rows per such stream)."""
        mask = self.do_sample == 1
        if not self.num_draft_tokens:
            return mask
        return np.repeat(np.nonzero(mask)[0], 1 + self.draft_lens[mask])

    def rows(self, mask: np.ndarray) -> SamplingRows:
        """The sampler's arrays for the rows `mask` selects (a boolean [S] mask, or an int index:
        sampled_streams())."""
        d = self.__dict__
        if mask.dtype == np.bool_ and mask.all():  # (every stream samples one row, as in decode: the arrays themselves)
            return SamplingRows(**{name: d[name] for name, _ in self._row_spec})
        rows = SamplingRows(**{name: d[name][mask] if masked else d[name] for name, masked in self._row_spec})
        if mask.dtype != np.bool_ and self.num_draft_tokens:
            with_draft_positions(self, rows, mask)
        return rows


def rows_spec(fields: List[Field]) -> Tuple[Tuple[str, bool], ...]:
    """StepBatch.rows' arrays, worked out once per engine (rows() runs every step): every SAMPLE
    and PARAM field, masked when it is an [S] array."""
    return tuple((f.name, f.length == LEN_S) for f in fields if f.group in (GROUP_SAMPLE, GROUP_PARAM))


@dataclass
class DecodedOutput:
    """A GenerateOutputsPB (from poll() or the gRPC stream) as Python values."""

    token_ids: List[int]
    finished: bool
    logprobs: Optional[List[float]]  # of token_ids, when the request asked for them
    aux: dict                        # upstream's aux_info names; times in milliseconds
    finish_reason: Optional[str] = None  # "stop" | "length" once finished (as the core decided)
    error_field: str = ""                # the field error_info is about, when there is an error
    # With top_logprobs k: per token id, its k best alternatives [(id, log-prob)], best first.
    top_logprobs: Optional[List[List[Tuple[int, float]]]] = None
    # With prompt_logprobs, in the output carrying the first tokens: prompt tokens 1..'s
    # log-probs, and with k > 0 their alternatives as top_logprobs' (else None).
    prompt_logprobs: Optional[List[float]] = None
    prompt_top_logprobs: Optional[List[List[Tuple[int, float]]]] = None
    # A PREFILL instance's request handed off after its first token: the prompt's blocks it kept
    # (AuxInfoPB.kv_export; finished, finish_reason None).
    kv_export: Optional[pb.KvExportPB] = None


def decode_output(out: pb.GenerateOutputsPB) -> DecodedOutput:
    flat = out.flatten_output
    ids = list(memoryview(flat.output_ids.int32_data).cast("i")) if flat.output_ids.int32_data else []
    a = flat.aux_info[0]
    logprobs = list(memoryview(a.logprobs.fp32_data).cast("f")) if a.logprobs.fp32_data else None
    aux = {
        "cost_time": a.cost_time_us / 1000.0, "first_token_cost_time": a.first_token_cost_time_us / 1000.0,
        "wait_time": a.wait_time_us / 1000.0, "iter_count": a.iter_count, "input_len": a.input_len,
        "prefix_len": a.prefix_len, "reuse_len": a.total_reuse_len, "output_len": a.output_len,
        # Speculative decoding (upstream's names): steps that verified drafts, and per draft
        # position how many of them accepted it.
        "speculative_draft_rounds": a.speculative_draft_rounds,
        "speculative_accepted_tokens_per_pos": list(a.speculative_accepted_tokens_per_pos),
    }
    prompt = list(memoryview(a.prompt_logprobs.fp32_data).cast("f")) if a.prompt_logprobs.fp32_data else None
    return DecodedOutput(ids, bool(flat.finished and flat.finished[0]), logprobs, aux, a.finish_reason or None,
                         out.error_info.field, _alternatives(a.top_token_ids, a.top_logprobs), prompt,
                         _alternatives(a.prompt_top_token_ids, a.prompt_top_logprobs),
                         a.kv_export if a.pd_sep else None)


def _alternatives(top_ids: pb.TensorPB, top_logprobs: pb.TensorPB) -> Optional[List[List[Tuple[int, float]]]]:
    """AuxInfoPB.top_token_ids / top_logprobs ([n, k]; or the prompt's) as n lists of up to k
    (id, log-prob). Alternatives the distribution ruled out (-inf: a grammar's mask, a forced
    token) are left out: they could not have been sampled, and JSON cannot carry -inf."""
    if not top_ids.int32_data:
        return None
    k = top_ids.shape[1]
    ids = memoryview(top_ids.int32_data).cast("i")
    lps = memoryview(top_logprobs.fp32_data).cast("f")
    return [[(t, lp) for t, lp in zip(ids[r:r + k], lps[r:r + k]) if lp > -math.inf] for r in range(0, len(ids), k)]


def _f32(a: np.ndarray, keep: list):
    a = np.ascontiguousarray(a, dtype=np.float32)
    keep.append(a)
    return a.ctypes.data_as(_f32p)


def _i32(a: np.ndarray, keep: list):
    a = np.ascontiguousarray(a, dtype=np.int32)
    keep.append(a)
    return a.ctypes.data_as(_i32p)


class PromptRows(NamedTuple):
    """A step's prompt rows (its tokens with prompt_targets >= 0, in token order) as commit()
    takes them: the target's log-prob [P] fp32 and its best alternatives [P, k] (ids int32,
    log-probs fp32; None when k is 0), from the model's raw distribution."""

    logprobs: np.ndarray
    top_ids: Optional[np.ndarray] = None
    top_logprobs: Optional[np.ndarray] = None


def _bind(lib, structs):
    config, batch, stats = (ctypes.POINTER(structs[n][0]) for n in ("RtpEngineConfig", "RtpStepBatch", "RtpEngineStats"))
    lib.rtp_llm_engine_create.restype = ctypes.c_void_p
    lib.rtp_llm_engine_create.argtypes = [config, ctypes.c_char_p, ctypes.c_int32]
    lib.rtp_llm_engine_destroy.argtypes = [ctypes.c_void_p]
    lib.rtp_llm_engine_enqueue.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32, _i64p,
                                           ctypes.c_char_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int32]
    for name in ("rtp_llm_engine_schedule", "rtp_llm_engine_schedule_ahead"):
        getattr(lib, name).restype = batch
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    lib.rtp_llm_engine_commit.argtypes = [ctypes.c_void_p, _i32p, _f32p, ctypes.c_int32, _i32p, _f32p,
                                          ctypes.c_int32, _f32p, ctypes.c_int32, _i32p, _f32p, ctypes.c_int32,
                                          _i32p, ctypes.c_char_p, ctypes.c_int32]
    lib.rtp_llm_engine_array_capacity.restype = ctypes.c_int64
    lib.rtp_llm_engine_array_capacity.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rtp_llm_engine_next_grammar.argtypes = [ctypes.c_void_p, _i64p, ctypes.c_char_p, ctypes.c_int32,
                                                ctypes.c_char_p, ctypes.c_int32]
    lib.rtp_llm_engine_grammar_done.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_char_p,
                                                ctypes.c_char_p, ctypes.c_int64, ctypes.c_int32]
    lib.rtp_llm_engine_take_ended_grammars.argtypes = [ctypes.c_void_p, _i64p, ctypes.c_int32]
    lib.rtp_llm_engine_fail_batch.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32]
    lib.rtp_llm_engine_wait_for_work.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rtp_llm_engine_stop.argtypes = [ctypes.c_void_p]
    lib.rtp_llm_engine_abort.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.rtp_llm_engine_poll.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p,
                                        ctypes.c_int32, _i32p]
    lib.rtp_llm_engine_stream_tokens.argtypes = [ctypes.c_void_p, ctypes.c_int64, _i32p, ctypes.c_int32, _i32p]
    lib.rtp_llm_engine_release.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.rtp_llm_engine_stats.argtypes = [ctypes.c_void_p, stats]
    lib.rtp_llm_engine_start_rpc_server.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                                    ctypes.c_int32]
    lib.rtp_llm_engine_stop_rpc_server.argtypes = [ctypes.c_void_p]
    kv_handoff.bind(lib)
    return lib


class EngineCore(kv_handoff.KvHandoffCalls):
    def __init__(self, num_blocks: int, block_size: int, max_batch_size: int, max_num_batched_tokens: int,
                 max_seq_len: int, reuse_cache: bool = True, eos_token_ids: Sequence[int] = (), vocab_size: int = 0,
                 gen_num_per_cycle: int = 0, sp_min_token_match: int = 2, sp_max_token_match: int = 3,
                 draft_model: bool = False, sp_fixed_drafts: bool = False):
        """vocab_size: the model's; prompt token ids at or past it are refused at enqueue (0: unchecked).
        gen_num_per_cycle > 0: speculative decoding, up to that many drafted tokens per stream per step:
        by prompt lookup (n-grams of sp_max_token_match down to sp_min_token_match tokens), or with
        draft_model the positions are reserved and the model runner's draft model fills them;
        sp_fixed_drafts: every round may draft gen_num_per_cycle (else each stream's pace decides)."""
        self._lib, structs = _abi()
        config_struct, _ = structs["RtpEngineConfig"]
        self._batch_fields = structs["RtpStepBatch"][1]
        self._stats_struct = structs["RtpEngineStats"][0]
        self._eos = (ctypes.c_int32 * max(len(eos_token_ids), 1))(*eos_token_ids)
        config = config_struct(num_blocks=num_blocks, block_size=block_size, max_batch_size=max_batch_size,
                               max_num_batched_tokens=max_num_batched_tokens, max_seq_len=max_seq_len,
                               reuse_cache=int(reuse_cache), vocab_size=vocab_size, eos_token_ids=self._eos,
                               num_eos_token_ids=len(eos_token_ids), gen_num_per_cycle=gen_num_per_cycle,
                               sp_min_token_match=sp_min_token_match, sp_max_token_match=sp_max_token_match,
                               draft_model=int(draft_model), sp_fixed_drafts=int(sp_fixed_drafts))
        err = ctypes.create_string_buffer(512)
        self._handle = self._lib.rtp_llm_engine_create(ctypes.byref(config), err, len(err))
        if not self._handle:
            raise ValueError(f"invalid engine config: {err.value.decode()}")
        self.block_size = block_size
        self.max_seq_len = max_seq_len
        self._err = ctypes.create_string_buffer(512)
        self._field = ctypes.create_string_buffer(64)
        self._poll_buf = ctypes.create_string_buffer(1 << 16)
        self._grammar_buf = ctypes.create_string_buffer(1 << 16)
        self._ended_buf = (ctypes.c_int64 * 256)()
        self._appended = np.zeros(max(max_batch_size, max_num_batched_tokens), dtype=np.int32)  # per sampled row
        self._views: dict = {}  # address of a batch buffer -> its arrays, mapped at full size
        self._arrays = [f for f in self._batch_fields if f.length != SCALAR]
        # The size each array length kind is preallocated to (the core's StepBatchCapacity).
        self._capacity = {f.length: self._lib.rtp_llm_engine_array_capacity(self._handle, f.length)
                          for f in self._arrays}
        # What _batch() reads every step, as plain tuples: the counts' names, (name, length) per array.
        self._count_names = tuple(f.name for f in self._batch_fields if f.length == SCALAR)
        self._array_lengths = tuple((f.name, f.length) for f in self._arrays)
        self._rows_spec = rows_spec(self._batch_fields)
        self._empty = StepBatch(self._rows_spec, {name: 0 for name in self._count_names},
                                {f.name: np.zeros(0, dtype=f.dtype) for f in self._arrays})
        self._empty.block_tables = self._empty.block_tables.reshape(0, 0)

    def close(self):
        if getattr(self, "_handle", None):
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
                                                len(self._err), self._field, len(self._field))
        if code != 0:
            raise EngineError(code, self._err.value.decode(), self._field.value.decode())
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
            v = self._views[key] = {f.name: np.ctypeslib.as_array(getattr(b, f.name), shape=(self._capacity[f.length],))
                                    for f in self._arrays}
        counts = {name: getattr(b, name) for name in self._count_names}
        c = SimpleNamespace(**counts)  # (a ctypes field read costs more than a namespace's)
        used = used_lengths(c)
        arrays = {name: v[name][:used[length]] for name, length in self._array_lengths}
        arrays["block_tables"] = arrays["block_tables"].reshape(c.num_streams, c.block_table_stride)
        return StepBatch(self._rows_spec, counts, arrays)

    def commit(self, tokens: np.ndarray, logprobs: Optional[np.ndarray] = None, top_ids: Optional[np.ndarray] = None,
               top_logprobs: Optional[np.ndarray] = None, prompt: Optional["PromptRows"] = None) -> np.ndarray:
        """The sampled tokens of the oldest uncommitted batch (its sampled rows in order:
        StepBatch.sampled_streams(); drafts are verified against them),
        their log-probs [N] and their best alternatives ([N, k] ids and log-probs, best first;
        k at least every row's top_logprobs); `prompt`: the batch's prompt rows (needed when its
        num_prompt_logprobs > 0). Returns which of the tokens were appended ([N] int32, 1 = kept;
        0 = dropped: the stream had ended or was cancelled), a view valid until the next commit."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        keep = []  # the contiguous copies, alive through the call
        lp = None
        if logprobs is not None:
            lp = _f32(logprobs, keep)
        k, ids, tlp = 0, None, None
        if top_ids is not None and top_ids.size:
            k, ids, tlp = top_ids.shape[1], _i32(top_ids, keep), _f32(top_logprobs, keep)
        np_, plp, pk, pids, ptlp = 0, None, 0, None, None
        if prompt is not None:
            np_, plp = len(prompt.logprobs), _f32(prompt.logprobs, keep)
            if prompt.top_ids is not None and prompt.top_ids.size:
                pk, pids, ptlp = prompt.top_ids.shape[1], _i32(prompt.top_ids, keep), _f32(prompt.top_logprobs, keep)
        appended = self._appended[:len(tokens)]
        code = self._lib.rtp_llm_engine_commit(self._handle, tokens.ctypes.data_as(_i32p), lp, len(tokens), ids, tlp,
                                               k, plp, np_, pids, ptlp, pk, appended.ctypes.data_as(_i32p),
                                               self._err, len(self._err))
        if code != 0:
            raise EngineError(code, self._err.value.decode())
        return appended

    def next_grammar(self) -> Optional[Tuple[int, str, str]]:
        """(stream id, grammar field, grammar text) of the next grammar to compile, or None."""
        sid = ctypes.c_int64()
        while True:
            n = self._lib.rtp_llm_engine_next_grammar(self._handle, ctypes.byref(sid), self._field, len(self._field),
                                                      self._grammar_buf, len(self._grammar_buf))
            if n < 0:
                return None
            if n <= len(self._grammar_buf):
                return sid.value, self._field.value.decode(), self._grammar_buf.raw[:n].decode()
            self._grammar_buf = ctypes.create_string_buffer(n)

    def grammar_done(self, stream_id: int, error: Optional[EngineError] = None, compile_us: int = 0,
                     cache_hit: bool = False):
        """The stream's grammar compiled (error None: it may be scheduled) or failed: the stream
        ends with `error` (its code, message and field). Thread-safe."""
        code, message, field = (error.code, error.message, error.field) if error is not None else (0, "", "")
        self._lib.rtp_llm_engine_grammar_done(self._handle, stream_id, code, message.encode(), field.encode(),
                                              int(compile_us), int(cache_hit))

    def take_ended_grammars(self) -> List[int]:
        """Ids of streams with a grammar that ended since the last call."""
        out: List[int] = []
        cap = len(self._ended_buf)
        while True:
            n = self._lib.rtp_llm_engine_take_ended_grammars(self._handle, self._ended_buf, cap)
            out += self._ended_buf[:n]
            if n < cap:
                return out

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
        """(all tokens of the stream as int32 numpy, prompt length): inspection for tests and tools
        (the sampler's history travels in the step batch)."""
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
        s = self._stats_struct()
        self._lib.rtp_llm_engine_stats(self._handle, ctypes.byref(s))
        return {name: getattr(s, name) for name, _ in s._fields_}

    def start_rpc_server(self, address: str) -> int:
        port = self._lib.rtp_llm_engine_start_rpc_server(self._handle, address.encode(), self._err, len(self._err))
        if port < 0:
            raise OSError(self._err.value.decode())
        return port

    def stop_rpc_server(self):
        self._lib.rtp_llm_engine_stop_rpc_server(self._handle)


def max_top_logprobs() -> int:
    """The most alternatives a sampled token may carry: top_logprobs' bound (step_batch_fields.h)."""
    return int(next(f.hi for f in step_batch_fields() if f.name == "top_logprobs"))
