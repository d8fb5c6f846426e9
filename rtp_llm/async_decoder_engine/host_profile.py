"""Where the engine thread's host time goes, by phase: a diagnostic that wraps an EngineLoop's
model runner, grammar book and core and sums the time spent in each call.

Phases (seconds, summed over the steps since the last reset): the runner's stage / forward /
fill_mask / sample / commit; inside commit, "wait" (blocked on the device for the step's tokens)
and "core_commit" (the core's bookkeeping and output delivery); inside sample, "mask_wait"
(waiting for, or gating on, the grammar mask and queueing its upload); the book's "advance"
(matchers), "poll" (compiles, ended streams) and "compiles" (waiting for one); the core's
"schedule"; "before:NAME", the time in a turn between the phase before (or the turn's start) and
its phase NAME ("before:end": after its last), which no phase accounts for; "gc", Python's cyclic
collections (counted per generation, "gcN"). Counts: turns of the
loop, the steps they scheduled, the streams and tokens they scheduled, how many had grammar rows or prompt tokens
(mixed steps), the wall time of the turns and the longest turn; and "stalls": where the engine
thread was, sampled each millisecond, during turns that took far longer than the mean (the
three most sampled stacks, innermost frame first). Nothing is synchronized beyond what the loop
waits for itself, so "wait" near zero means the host is the bottleneck. And the thread's own
scheduling (Linux, /proc/thread-self): its CPU time, the time it sat runnable but not running
(run_delay: other threads had its core) and how often it was preempted, over the same span: a
host phase that takes longer than its work may be waiting for a core, or for the GIL (then
neither CPU time nor run_delay counts it).

Used by `python -m rtp_llm.tools.profile_host` (offline) and by the server with --host_profile,
which logs one line per burst of work (EngineLoop: a line when the engine goes idle), so a load
test's point and the offline profile of the same step compare phase by phase."""

import gc
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from typing import Dict, Tuple

from rtp_llm.async_decoder_engine.grammar import MaskFill

# A turn stalls once it has lasted this many times the mean turn, and at least STALL_MIN_S; each
# stall sample keeps the engine thread's STALL_FRAMES innermost frames.
STALL_FACTOR, STALL_MIN_S, STALL_FRAMES = 4, 0.02, 6
_RUNNER = ("stage", "forward", "fill_mask", "sample", "commit")


def _thread_sched() -> Tuple[float, float, int]:
    """The calling thread's (CPU seconds, run-queue delay seconds, involuntary context switches)
    so far; zeros where /proc/thread-self does not say (not Linux, no schedstats)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            cpu_ns, delay_ns = (int(x) for x in f.read().split()[:2])
        with open("/proc/thread-self/status") as f:
            preempted = next(int(line.split()[1]) for line in f if line.startswith("nonvoluntary_ctxt_switches"))
        return cpu_ns * 1e-9, delay_ns * 1e-9, preempted
    except (OSError, ValueError, StopIteration):
        return 0.0, 0.0, 0


class HostProfile:
    """Attached to `engine` (an EngineLoop of rank 0) from construction until detach(); made,
    reset and reported in the thread that steps it (its scheduling is that thread's)."""

    def __init__(self, engine):
        self.totals: Dict[str, float] = defaultdict(float)
        self.counts: Dict[str, int] = defaultdict(int)
        self._sched = _thread_sched()
        self._engine = engine
        self._patched = []
        self._depth, self._mark = 0, 0.0  # calls in progress; when the turn's last top-level phase ended
        self.longest_turn = 0.0
        self._turn_start, self._turn_thread = 0.0, 0  # the turn in progress (0: none), its thread
        self._stalls: Counter = Counter()  # stack -> samples (ms) of turns that stalled there
        self._stall_lock, self._stop = threading.Lock(), threading.Event()
        threading.Thread(target=self._sample_stalls, name="rtp_llm-host-profile", daemon=True).start()
        runner, book, core = engine.runner, engine.grammar, engine.core
        for name in _RUNNER:
            self._wrap(runner, name, name)
        self._wrap(book, "advance", "advance")
        self._wrap(book, "poll", "poll")
        self._wrap(book, "wait_for_compiles", "compiles")
        self._wrap(core, "commit", "core_commit")
        for name in ("schedule", "schedule_ahead"):
            self._wrap(core, name, "schedule", self._count_batch)
        self._mask_result = MaskFill.result
        MaskFill.result = self._timed("mask_wait", self._mask_result)
        commit = runner.commit  # (the timed one) its step's result() is the device wait

        def commit_waits(core_, step):
            step.result = self._timed("wait", step.result)
            return commit(core_, step)
        runner.commit = commit_waits  # (replaces the timed one, which it calls; detach() drops both)
        self._gc_start = 0.0
        gc.callbacks.append(self._gc_timed)
        engine.step = self._timed_turn(engine.step)

    def _timed(self, name, call, after=None):
        """call, its time summed under `name`; a call directly inside a turn (a top-level phase)
        also sums the time since the turn's previous phase (or its start) under "before:NAME":
        host time that no phase accounts for."""
        totals = self.totals

        def timed(*args):
            t = time.perf_counter()
            top = self._depth == 1
            if top:
                totals["before:" + name] += t - self._mark
            self._depth += 1
            try:
                out = call(*args)
            finally:
                self._depth -= 1
                end = time.perf_counter()
                totals[name] += end - t
                if top:
                    self._mark = end
            if after is not None:
                after(out)
            return out
        return timed

    def _timed_turn(self, step):
        """engine.step as a turn: its time under "turn", the time after its last phase under
        "before:end", the longest turn, and the turn in progress for the stall sampler."""
        totals, counts = self.totals, self.counts

        def turn(*args):
            t = time.perf_counter()
            self._mark, self._turn_start, self._turn_thread = t, t, threading.get_ident()
            self._depth += 1
            try:
                out = step(*args)
            finally:
                self._depth -= 1
                end = time.perf_counter()
                self._turn_start = 0.0
                totals["turn"] += end - t
                totals["before:end"] += end - self._mark
                self.longest_turn = max(self.longest_turn, end - t)
            counts["turns"] += 1
            return out
        return turn

    def _gc_timed(self, phase: str, info: dict):
        """Python's cyclic collections (any thread's; the engine thread's steps trigger most):
        their time under "gc", their count per generation under "gcN"."""
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.totals["gc"] += time.perf_counter() - self._gc_start
            self.counts["gc%d" % info["generation"]] += 1

    def _sample_stalls(self):
        """Every millisecond, while a turn has lasted over STALL_FACTOR times the mean turn (and
        at least STALL_MIN_S), the engine thread's innermost frames: where a stall spends its
        time, in samples of ~1 ms. (A stall that holds the GIL shows where the thread went on.)
        Otherwise it sleeps until the turn in progress would stall: it takes the GIL from the
        engine thread tens of times a second, not a thousand."""
        while True:
            start, turns = self._turn_start, self.counts.get("turns", 0)
            limit = max(STALL_MIN_S, STALL_FACTOR * self.totals.get("turn", 0.0) / turns if turns else 0.0)
            due = start + limit - time.perf_counter() if start else limit
            if due <= 0:
                self._sample_stall()
            if self._stop.wait(max(due, 0.001)):
                return

    def _sample_stall(self):
        frame = sys._current_frames().get(self._turn_thread)
        if frame is not None:
            stack = " < ".join(f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{line} {f.f_code.co_name}"
                               for f, line in list(traceback.walk_stack(frame))[:STALL_FRAMES])
            with self._stall_lock:
                self._stalls[stack] += 1

    def _wrap(self, obj, attr: str, name: str, after=None):
        self._patched.append((obj, attr))
        setattr(obj, attr, self._timed(name, getattr(obj, attr), after))

    def _count_batch(self, b):
        c = self.counts
        if b.num_streams == 0:
            return
        c["steps"] += 1
        c["streams"] += int(b.num_streams)
        c["tokens"] += len(b.token_ids)
        c["grammar_steps"] += b.num_grammar > 0
        c["mixed_steps"] += len(b.token_ids) > b.num_streams

    def reset(self):
        self.longest_turn = 0.0
        with self._stall_lock:
            self._stalls.clear()
        self.totals.clear()
        self.counts.clear()
        self._sched = _thread_sched()

    def report(self) -> dict:
        """The totals since the last reset: counts, and each phase's ms per scheduled step."""
        steps = max(self.counts.get("steps", 0), 1)
        per = {k: round(v / steps * 1e3, 3) for k, v in sorted(self.totals.items())}
        cpu, delay, preempted = (now - then for now, then in zip(_thread_sched(), self._sched))
        return {**dict(sorted(self.counts.items())), "wall_s": round(self.totals.get("turn", 0.0), 3),
                "longest_turn_ms": round(self.longest_turn * 1e3, 3), "stalls": self._top_stalls(),
                "host_ms_per_step": per, "thread": {"cpu_ms_per_step": round(cpu / steps * 1e3, 3),
                                                    "run_delay_ms_per_step": round(delay / steps * 1e3, 3),
                                                    "preempted": preempted}}

    def _top_stalls(self):
        with self._stall_lock:
            return [[stack, samples] for stack, samples in self._stalls.most_common(3)]

    def detach(self):
        self._stop.set()
        gc.callbacks.remove(self._gc_timed)
        MaskFill.result = self._mask_result
        for obj, attr in self._patched:
            delattr(obj, attr)  # (the instance attribute shadowed the class's method)
        self._engine.__dict__.pop("step", None)
        self._patched.clear()
