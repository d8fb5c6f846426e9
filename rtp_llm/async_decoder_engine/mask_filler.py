"""Fills a grammar step's token bitmask from its matchers, once they accepted the tokens their
streams kept at the commits since the last fill (Accepts, recorded by GrammarBook.advance).

Under overlap the fill runs on a thread of its own while the engine thread schedules and
stages the next step (engine.py's second diagram), as one xgrammar batch call: it releases the
GIL until it is done, so the thread needs the GIL only to hand the result back. Measured on the
H200 host (docs/serving_benchmarks.md): anything more on other threads was slower than the
engine thread doing it (matchers accepting tokens there, or several threads each returning to
Python while the engine thread staged), since each return waits for the GIL the engine thread
holds.

A few rows are filled one matcher at a time in the engine thread: xgrammar's batch call wakes
its own pool of threads ("auto": half the cores), which costs more than a few rows take (a
one-stream step under a schema took 1.8 ms instead of 0.85 that way).

With a device gate (DeviceBackend.host_gate: CUDA) the engine thread does not wait for a
threaded fill at all: the mask's upload and the sampling queue behind a gate wait that this
thread opens once the fill is done, so the device goes from the forward before straight to the
sampling, and the host launches both while xgrammar fills. Whether the fill succeeded is checked
at the step's commit (FillJob.check): a failed fill fails the step, never a step sampled with a
half-written mask.

Where xgrammar binds with tvm-ffi (0.2 on), the accepts and the threaded fill run on a native
thread instead (native_fill.py), which never takes the GIL; elsewhere the accepts run in the
engine thread before the fill. The first native job is checked against xgrammar's Python calls
(on forks of the matchers; its gate opened only then), and a mismatch keeps the Python thread
for good.

Invariant: at most one fill is in flight, and nothing else touches a matcher while it is (the
engine checks its job before the next commit); a gated job opens its ticket however the fill
ends."""

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional

import torch

from rtp_llm.async_decoder_engine.native_fill import NativeMatcherJob, native_fill_enabled
from rtp_llm.device.base import HostGate

log = logging.getLogger(__name__)

# From this many live rows the fill is one batch call (on the thread under overlap); below, one
# call per matcher in the engine thread.
BATCH_MIN_ROWS = 8


def fill_threads():
    """xgrammar's threads for a batch fill: RTP_LLM_GRAMMAR_FILL_THREADS (a tuning knob, measured in
    docs/serving_benchmarks.md), default "auto" (xgrammar's: half the cores)."""
    value = os.environ.get("RTP_LLM_GRAMMAR_FILL_THREADS", "auto")
    if value != "auto" and not (value.isdigit() and int(value) >= 1):
        raise ValueError(f"RTP_LLM_GRAMMAR_FILL_THREADS must be 'auto' or an integer >= 1, got {value!r}")
    return value if value == "auto" else int(value)


class Accepts:
    """Tokens the core kept for grammar streams, in commit order, for their matchers to accept
    before the next fill (a matcher may appear more than once: two commits before a fill)."""

    def __init__(self):
        self.sids: List[int] = []
        self.matchers: list = []
        self.tokens: List[int] = []

    def add(self, sid: int, matcher, token: int):
        self.sids.append(sid)
        self.matchers.append(matcher)
        self.tokens.append(token)

    def apply(self) -> List[int]:
        """Accepts them in the caller's thread (one xgrammar batch call: with xgrammar 0.2.9 a
        quarter of the time of one accept_token per row, docs/serving_benchmarks.md session 17);
        returns (and logs) the indices of the tokens rejected."""
        if not self.matchers:
            return []
        import xgrammar as xgr

        ok = xgr.BatchGrammarMatcher.batch_accept_token(self.matchers, self.tokens)
        rejected = [] if all(ok) else [i for i, good in enumerate(ok) if not good]
        self.report(rejected)
        return rejected

    def report(self, rejected):
        for i in rejected:
            log.error("stream %d: the grammar rejects its sampled token %d (the mask allowed it)", self.sids[i],
                      self.tokens[i])


class FillJob:
    """A fill in flight on a thread. ticket: the gate ticket it opens when done (0: none)."""

    def __init__(self, wait: Callable[[], object], gate: Optional[HostGate] = None, ticket: int = 0,
                 on_device: bool = False):
        """on_device: the job copies the mask to the device itself before it opens the ticket."""
        self._wait, self._gate, self.ticket, self.on_device = wait, gate, ticket, on_device
        self._error: Optional[BaseException] = None

    def wait(self):
        """Returns once the fill is done, re-raising what it raised (each call: the job's wait
        runs once)."""
        if self._wait is not None:
            wait, self._wait = self._wait, None
            try:
                wait()
            except BaseException as e:
                self._error = e
                raise
        elif self._error is not None:
            raise self._error

    def ready_on_device(self) -> bool:
        """Holds the device's stream until the fill is done (queues the gate's wait; the caller
        queues what reads the mask next); False where there is no gate: wait() on the host."""
        if self._gate is None:
            return False
        self._gate.wait(self.ticket)
        return True

    check = wait  # at the step's commit: a gated fill that failed fails its step


class MaskFiller:
    """threaded: batch fills run on a thread of their own (an engine with host work to do
    meanwhile); else in the caller's thread, at submit. gate: the device's (threaded only)."""

    def __init__(self, threaded: bool, gate: Optional[HostGate] = None):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rtp_llm-mask") if threaded else None
        self._gate = gate if threaded else None
        self._batch = None  # xgrammar's BatchGrammarMatcher, made on first use
        self._threads = fill_threads()  # (read here: a bad value fails the engine's start, not its steps)
        self._native_wanted = threaded and native_fill_enabled()
        self._native: Optional[NativeMatcherJob] = None  # made with _batch where xgrammar allows
        self._native_checked = False  # its first fill equalled xgrammar's Python call

    def submit(self, accepts: Accepts, live: list, host: torch.Tensor, rows: List[int],
               device_bits: Optional[torch.Tensor] = None) -> Optional[FillJob]:
        """Has the accepts accepted, then fills host[rows[j]] ([G, W] int32) from matcher live[j],
        or starts to: None when done. device_bits (host's shape, on the device): where the gate
        copies on the worker (HostGate.copies_on_worker), a native job copies the mask there
        before it opens its ticket (FillJob.on_device)."""
        native = self._native_job() if len(live) >= BATCH_MIN_ROWS and self._pool is not None else None
        if native is None:
            accepts.apply()
        if len(live) < BATCH_MIN_ROWS:
            for matcher, row in zip(live, rows):
                matcher.fill_next_token_bitmask(host, row)
            return None
        if self._pool is None:
            self._fill(live, host, rows)
            return None
        if native is not None and not self._native_checked:
            self._check_native(accepts, live, host, rows)
            return None
        ticket = self._gate.next() if self._gate is not None else 0
        if native is not None:
            gate = self._gate
            copy = gate is not None and gate.copies_on_worker and device_bits is not None
            after = (lambda: gate.worker_copy(host, device_bits)) if copy else None
            wait = native.submit(accepts.matchers, accepts.tokens, live, host, rows, gate, ticket, after)
            return FillJob(lambda: accepts.report(wait()), gate, ticket, on_device=copy)
        return FillJob(self._pool.submit(self._fill_and_open, live, host, rows, ticket).result, self._gate, ticket)

    def _native_job(self) -> Optional[NativeMatcherJob]:
        self._batch_matcher()
        # (a gate the native thread cannot open itself keeps the Python thread)
        return self._native if self._gate is None or self._gate.counter_address() is not None else None

    def _check_native(self, accepts: Accepts, live: list, host: torch.Tensor, rows: List[int]):
        """The first native job, run on forks of the matchers and compared with xgrammar's Python
        calls on the matchers themselves, whose mask `host` keeps; where they differ (or the native
        job fails) the native thread is never used."""
        forks = {id(m): m.fork() for m in accepts.matchers + live}
        expected = host.clone()
        python_rejected = accepts.apply()  # (xgrammar's own errors fail the step as on the thread)
        self._fill(live, expected, rows)
        try:
            rejected = self._native.submit([forks[id(m)] for m in accepts.matchers], accepts.tokens,
                                           [forks[id(m)] for m in live], host, rows, None, 0)()
            why = ("its mask differs from xgrammar's Python call" if not torch.equal(host, expected) else
                   "its matchers' accepts differ from xgrammar's Python call" if list(rejected) != python_rejected
                   else "")
        except RuntimeError as e:
            why = str(e)
        host.copy_(expected)
        if not why:
            self._native_checked = True
            return
        log.error("the native grammar mask fill is not used (%s): masks fill on a Python thread", why)
        self._native.close()
        self._native = None

    def _fill_and_open(self, live: list, host: torch.Tensor, rows: List[int], ticket: int):
        try:
            self._fill(live, host, rows)
        finally:
            if ticket:
                self._gate.open(ticket)

    def _batch_matcher(self):
        if self._batch is None:
            import xgrammar as xgr

            self._batch = xgr.BatchGrammarMatcher(self._threads)
            if self._native_wanted:
                self._native = NativeMatcherJob.create(self._batch)
        return self._batch

    def _fill(self, live: list, host: torch.Tensor, rows: List[int]):
        self._batch_matcher().batch_fill_next_token_bitmask(live, host, rows)

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._native is not None:
            self._native.close()
