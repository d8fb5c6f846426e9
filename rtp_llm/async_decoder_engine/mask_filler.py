"""Fills a grammar step's token bitmask from its matchers.

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

Invariant: at most one fill is in flight, and nothing else touches a matcher while it is (the
engine takes its result before the next commit)."""

from concurrent.futures import Future, ThreadPoolExecutor
from typing import List, Optional

import torch

# From this many live rows the fill is one batch call (on the thread under overlap); below, one
# call per matcher in the engine thread.
BATCH_MIN_ROWS = 8


class FillJob:
    """A fill in flight on the thread: wait() returns once it is done (re-raising what it raised)."""

    def __init__(self, future: Future):
        self._future = future

    def wait(self):
        self._future.result()


class MaskFiller:
    """threaded: batch fills run on a thread of their own (an engine with host work to do
    meanwhile); else in the caller's thread, at submit."""

    def __init__(self, threaded: bool):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rtp_llm-mask") if threaded else None
        self._batch = None  # xgrammar's BatchGrammarMatcher, made on first use

    def submit(self, live: list, host: torch.Tensor, rows: List[int]) -> Optional[FillJob]:
        """Fills host[rows[j]] ([G, W] int32) from matcher live[j], or starts to: None when done."""
        if len(live) < BATCH_MIN_ROWS:
            for matcher, row in zip(live, rows):
                matcher.fill_next_token_bitmask(host, row)
            return None
        if self._pool is None:
            self._fill(live, host, rows)
            return None
        return FillJob(self._pool.submit(self._fill, live, host, rows))

    def _fill(self, live: list, host: torch.Tensor, rows: List[int]):
        if self._batch is None:
            import xgrammar as xgr

            self._batch = xgr.BatchGrammarMatcher("auto")
        self._batch.batch_fill_next_token_bitmask(live, host, rows)

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
