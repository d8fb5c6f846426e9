"""Grammar-constrained sampling with xgrammar, in the engine process (rank 0).

A stream enqueued with a grammar (GenerateConfigPB json_schema / regex / ebnf / structural_tag)
waits unadmitted in the core until its grammar is compiled here, off the engine's thread
(GrammarCompiler: a thread pool, a cache keyed by (field, text), a timeout that fails only that
stream). Once it runs, each step that samples it fills its row of a token bitmask from the
stream's matcher (GrammarBook.fill, on a thread of its own under overlap; xgrammar's layout:
[G, ceil(V/32)] int32, bit j of word w allows token 32 w + j) and the sampler masks its logits
with it. The matcher advances on exactly the tokens the core keeps at commit
(GrammarBook.advance with commit()'s appended flags), so a row an ahead step wasted (its stream
had ended) never reaches it and nothing is rolled back. A terminated matcher (its grammar complete, a stop token accepted) allows only
the stop tokens (the model's EOS ids).

The core's calls (next_grammar, grammar_done, take_ended_grammars) are in
rtp_llm/ops/engine_core.py; error codes are upstream's (INVALID_PARAMS 605, GENERATE_TIMEOUT 603)."""

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from rtp_llm.async_decoder_engine.mask_filler import Accepts, FillJob, MaskFiller
from rtp_llm.device.base import HostGate
from rtp_llm.device.base import int32_bit
from rtp_llm.ops.engine_core import EngineError
from rtp_llm.utils.host_heap import settle_heap

log = logging.getLogger(__name__)

INVALID_PARAMS = 605
GENERATE_TIMEOUT = 603
CACHE_ENTRIES = 512  # compiled grammars kept (least recently used dropped first)


@dataclass
class GrammarOptions:
    """The server flags: --grammar_num_workers (compile threads),
    --grammar_admission_compile_timeout_s (a stream whose grammar is not compiled by then
    fails), --constrained_json_disable_any_whitespace (JSON without optional whitespace)."""

    threads: int = 2
    timeout_s: float = 30.0
    compact_json: bool = True


@dataclass
class TokenBitmask:
    """The token mask of a step's grammar rows, on the device: rows [G] int64 (indices into the
    step's sampled rows), bits [G, ceil(V/32)] int32."""

    rows: torch.Tensor
    bits: torch.Tensor


class MaskFill:
    """A step's mask being filled (GrammarBook.fill; mask_filler.py: on a thread of its own
    under overlap, else already filled). result() queues its upload behind the fill: on the
    device behind the gate the filler opens (then check() at the step's commit re-raises what
    the fill raised), else on the host."""

    def __init__(self, book: "GrammarBook", g: int, job: Optional[FillJob]):
        self._book, self._g, self._job = book, g, job

    def check(self):
        if self._job is not None:
            self._job.check()

    def result(self) -> TokenBitmask:
        book, g = self._book, self._g
        rows = book._host_rows[:g].to(book.device, non_blocking=True)  # (known before the fill)
        if self._job is not None and not self._job.ready_on_device():
            self._job.wait()  # (re-raises what the fill raised)
        if self._job is not None and self._job.on_device:  # (the fill's job copied it, then opened the gate)
            return TokenBitmask(rows, book._device_bits[:g])
        return TokenBitmask(rows, book._host[:g].to(book.device, non_blocking=True))


class GrammarCompiler:
    """Compiles (field, text) into xgrammar CompiledGrammars on a thread pool (xgrammar releases
    the GIL while it compiles), each at most once while cached."""

    def __init__(self, tokenizer_source: Callable[[], Any], vocab_size: int, stop_token_ids: Sequence[int],
                 options: GrammarOptions):
        # (called at the first compile: the tokenizer is not kept once xgrammar has read it)
        self._tokenizer_source, self._vocab_size, self._stop = tokenizer_source, vocab_size, list(stop_token_ids)
        self.options = options
        self._pool = ThreadPoolExecutor(max(1, options.threads), thread_name_prefix="rtp_llm-grammar")
        self._lock = threading.Lock()  # the cache (the engine thread submits under it: held briefly)
        self._init_lock = threading.Lock()  # the compiler, built once on a pool thread
        self._compiler = None  # built by the first compile (importing xgrammar and reading the vocabulary take seconds)
        self._cache: "OrderedDict[Tuple[str, str], Future]" = OrderedDict()

    def submit(self, field: str, spec: str) -> Tuple[Future, bool]:
        """(a Future of (CompiledGrammar, compile time in us), True when it was cached or
        compiling already). The Future raises EngineError naming `field` when `spec` does not
        compile."""
        key = (field, spec)
        with self._lock:
            f = self._cache.get(key)
            if f is not None:
                self._cache.move_to_end(key)
                return f, True
            f = self._cache[key] = self._pool.submit(self._compile, field, spec)
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return f, False

    def _xgrammar(self):
        with self._init_lock:
            if self._compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(self._tokenizer_source(), vocab_size=self._vocab_size,
                                                          stop_token_ids=self._stop)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
                settle_heap()  # (the tokenizer, where it was loaded for this)
            return self._compiler

    def _compile(self, field: str, spec: str):
        compiler = self._xgrammar()
        start = time.perf_counter()
        try:
            if field == "json_schema":
                compact = self.options.compact_json
                compiled = compiler.compile_json_schema(spec, any_whitespace=not compact,
                                                        separators=(",", ":") if compact else None)
            elif field == "regex":
                compiled = compiler.compile_regex(spec)
            elif field == "ebnf":
                compiled = compiler.compile_grammar(spec)
            elif field == "structural_tag":
                compiled = compiler.compile_structural_tag(spec)
            else:
                raise ValueError(f"unknown grammar field {field!r}")
        except Exception as e:  # xgrammar reports bad grammars as RuntimeError / ValueError / its own types
            reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise EngineError(INVALID_PARAMS, f"{field} does not compile: {reason}", field) from None
        return compiled, max(1, int((time.perf_counter() - start) * 1e6))

    def close(self):
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Stream:
    """One grammar stream's state: its compiled grammar, then its matcher (made at its first
    sample), how many tokens the matcher accepted (== the stream's generated tokens) and whether
    it terminated (accepted a stop token: xgrammar's is_terminated(), tracked here because the
    mask and the advance ask it of every row at every step)."""

    __slots__ = ("compiled", "matcher", "accepted", "terminated")

    def __init__(self, compiled):
        self.compiled, self.matcher, self.accepted, self.terminated = compiled, None, 0, False


class GrammarBook:
    """The engine's grammar streams. poll() (engine thread, every step) hands new grammars to
    the compiler, fails those past the timeout and forgets streams that ended; fill() fills a
    step's rows; advance() applies its committed tokens. compiler None: every grammar fails
    with `unavailable` (naming its field). fill_thread: fill masks on a thread of their own
    (mask_filler.py; an engine with host work to do meanwhile: overlapped scheduling), and
    with the device's `gate` the sampling waits for them on the device."""

    def __init__(self, core, compiler: Optional[GrammarCompiler], vocab_size: int, max_rows: int,
                 device: torch.device, pin: bool, stop_token_ids: Sequence[int], unavailable: str = "",
                 fill_thread: bool = False, gate: Optional[HostGate] = None):
        self.core, self.compiler, self.unavailable = core, compiler, unavailable
        self.device = device
        self._lock = threading.Lock()
        self._streams: Dict[int, _Stream] = {}
        self._compiling: Dict[int, Tuple[str, float]] = {}  # stream id -> (field, when submitted)
        self._settling = 0      # compiles done, not yet handed to the core
        self._settled = False   # a compile was handed to the core since the last wait_for_compiles()
        words = -(-vocab_size // 32)
        # Host rows and row indices, filled each step and uploaded (pinned: the upload does not
        # block). One of each is enough: a step's mask is filled only after the step before it
        # committed, so that step's upload (queued before its sampling) has completed.
        self._host = torch.zeros(max_rows, words, dtype=torch.int32, pin_memory=pin)
        self._host_rows = torch.zeros(max_rows, dtype=torch.int64, pin_memory=pin)
        # Where the gate copies on the native thread, the mask's device copy, written by the fill's
        # job (one is enough, as for _host: the step before has sampled when the next fill starts).
        copies = fill_thread and compiler is not None and gate is not None and gate.copies_on_worker
        self._device_bits = torch.empty(max_rows, words, dtype=torch.int32, device=device) if copies else None
        self._stop_row = torch.zeros(words, dtype=torch.int32)  # a terminated matcher's row: stop tokens only
        self._stop_ids = frozenset(int(t) for t in stop_token_ids)  # (the tokenizer info's: they terminate a matcher)
        for t in stop_token_ids:
            if 0 <= t < vocab_size:
                self._stop_row[t // 32] |= int32_bit(t % 32)
        self._filler = MaskFiller(fill_thread and compiler is not None, gate)
        self._accepts = Accepts()  # committed tokens the matchers accept before the next fill
        self._ended_pending = False  # a grammar stream may have ended since the last take

    @classmethod
    def refusing(cls, core, reason: str) -> "GrammarBook":
        """A book that fails every grammar with `reason` (an engine that cannot sample with one)."""
        return cls(core, None, 32, 1, torch.device("cpu"), False, (), reason)

    # ---- compiling (engine thread; completions on the compiler's threads)

    def poll(self):
        if self._ended_pending:  # (an engine without grammar streams makes one call a step, not two)
            for sid in self.core.take_ended_grammars():
                with self._lock:
                    self._streams.pop(sid, None)
                    self._compiling.pop(sid, None)
            self._ended_pending = bool(self._streams or self._compiling)
        while (g := self.core.next_grammar()) is not None:
            self._start(*g)
        if self._compiling:
            self._expire(time.monotonic())

    def _start(self, sid: int, field: str, spec: str):
        self._ended_pending = True  # it will end, and be taken from the core's list
        if self.compiler is None:
            self.core.grammar_done(sid, EngineError(INVALID_PARAMS, f"{field}: {self.unavailable}", field))
            return
        future, hit = self.compiler.submit(field, spec)
        with self._lock:
            self._compiling[sid] = (field, time.monotonic())
        future.add_done_callback(lambda f: self._compiled(sid, f, hit))

    def _compiled(self, sid: int, f: Future, hit: bool):
        with self._lock:
            if self._compiling.pop(sid, None) is None:
                return  # timed out or ended meanwhile
            self._settling += 1  # (until the core has it: the engine must not find no work meanwhile)
            error = f.exception() if not f.cancelled() else EngineError(INVALID_PARAMS, "cancelled")
            if error is None:
                compiled, compile_us = f.result()
                self._streams[sid] = _Stream(compiled)
        try:
            if error is not None and not isinstance(error, EngineError):
                log.error("grammar of stream %d failed to compile", sid, exc_info=error)
                error = EngineError(INVALID_PARAMS, f"the grammar failed to compile: {error}")
            self.core.grammar_done(sid, error, 0 if hit or error else compile_us, hit)
        finally:
            with self._lock:
                self._settling -= 1
                self._settled = True

    def _expire(self, now: float):
        timeout = self.compiler.options.timeout_s
        with self._lock:
            late = [(sid, field) for sid, (field, t0) in self._compiling.items() if now - t0 > timeout]
            for sid, _ in late:
                del self._compiling[sid]
        for sid, field in late:
            self.core.grammar_done(sid, EngineError(
                GENERATE_TIMEOUT, f"{field} did not compile within --grammar_admission_compile_timeout_s="
                                  f"{timeout:g}", field))

    def compiling(self) -> bool:
        """A grammar is compiling, or its result is on its way to the core (its stream waits;
        poll() must keep running for its timeout)."""
        return bool(self._compiling) or self._settling > 0

    def wait_for_compiles(self, timeout_ms: int = 10) -> bool:
        """False when no grammar is compiling and none finished since the last call; else
        True: the streams it held back will run (or fail) in a later step. While one compiles,
        waits up to timeout_ms for work first (a compile that finishes wakes it). (A compile that
        finished after the step was scheduled counts: without it an offline generate() could
        stop with that stream still waiting.)"""
        with self._lock:
            busy = bool(self._compiling) or self._settling > 0
            settled, self._settled = self._settled, False
        if busy:
            self.core.wait_for_work(timeout_ms)
        return busy or settled

    # ---- sampling (engine thread)

    def fill(self, stream_ids: np.ndarray, rows: np.ndarray) -> MaskFill:
        """Starts filling the mask of the grammar rows `rows` (indices into the sampled rows) of
        streams `stream_ids` ([G] each), for the token after the ones their matchers accepted.
        Until its result() is taken no other call may reach a matcher (the step before must
        have committed; the next commit comes after this step samples)."""
        g = len(rows)
        host = self._host[:g]
        self._host_rows[:g].numpy()[:] = rows
        live, live_rows = self._live_rows(stream_ids, host)
        accepts, self._accepts = self._accepts, Accepts()
        device_bits = self._device_bits[:g] if self._device_bits is not None else None
        return MaskFill(self, g, self._filler.submit(accepts, live, host, live_rows, device_bits))

    def bitmask(self, stream_ids: np.ndarray, rows: np.ndarray) -> TokenBitmask:
        """fill(), waited for."""
        return self.fill(stream_ids, rows).result()

    def _live_rows(self, stream_ids: np.ndarray, host: torch.Tensor) -> Tuple[list, List[int]]:
        """(the matchers that fill a row, their rows); writes the other rows of `host` [G, W]:
        a terminated matcher's allows the stop tokens, a stream without a grammar's everything."""
        import xgrammar as xgr

        live, live_rows = [], []
        streams = self._streams
        for j, sid in enumerate(stream_ids.tolist()):
            st = streams.get(sid)
            if st is None:  # cannot happen for a scheduled stream; its token is not constrained
                host[j].fill_(-1)
            elif st.terminated:
                host[j].copy_(self._stop_row)
            else:
                if st.matcher is None:
                    st.matcher = xgr.GrammarMatcher(st.compiled)
                live.append(st.matcher)
                live_rows.append(j)
        return live, live_rows

    def advance(self, stream_ids: np.ndarray, tokens: np.ndarray, appended: np.ndarray):
        """Each grammar row's committed token, where the core kept it (appended), for its
        stream's matcher to accept — once per committed token — before the next fill
        (MaskFiller.submit: on the native thread where it can, so the engine thread only
        records them here)."""
        streams, accepts, stop = self._streams, self._accepts, self._stop_ids
        for sid, token, kept in zip(stream_ids.tolist(), tokens.tolist(), appended.tolist()):
            st = streams.get(sid)
            if not kept or st is None or st.matcher is None:
                continue
            st.accepted += 1
            if not st.terminated:  # (past its grammar: ignore_eos, min_new_tokens; stop tokens only)
                accepts.add(sid, st.matcher, token)
                st.terminated = token in stop

    def accepted(self, sid: int) -> int:
        """Tokens the stream's matcher accepted or will before its next fill (tests)."""
        st = self._streams.get(sid)
        return st.accepted if st is not None else -1

    def close(self):
        if self.compiler is not None:
            self.compiler.close()
        self._filler.close()


def make_grammar_book(core, tokenizer_source: Optional[Callable[[], Any]], vocab_size: int, eos_token_ids: List[int],
                      max_rows: int, device: torch.device, pin: bool, options: GrammarOptions,
                      fill_thread: bool = False, gate: Optional[HostGate] = None) -> GrammarBook:
    """The engine's GrammarBook: one that compiles with the model's tokenizer (tokenizer_source()
    gives it at the first grammar: LoadedModel.tokenizer_source), or (no tokenizer, or xgrammar
    not installed) one that fails every grammar saying why. fill_thread, gate: GrammarBook's."""
    reason = ""
    if tokenizer_source is None:
        reason = "grammars need the model's tokenizer, and this checkpoint has none: pass --tokenizer_path"
    else:
        import importlib.util

        if importlib.util.find_spec("xgrammar") is None:
            reason = "grammars need the xgrammar package, which is not installed"
    compiler = None if reason else GrammarCompiler(tokenizer_source, vocab_size, eos_token_ids, options)
    return GrammarBook(core, compiler, vocab_size, max_rows, device, pin, eos_token_ids, reason, fill_thread, gate)
