"""Where the engine thread's host time goes, by phase: a diagnostic that wraps an EngineLoop's
model runner, grammar book and core and sums the time spent in each call.

Phases (seconds, summed over the steps since the last reset): the runner's stage / forward /
fill_mask / sample / commit; inside commit, "wait" (blocked on the device for the step's tokens)
and "core_commit" (the core's bookkeeping and output delivery); inside sample, "mask_wait"
(waiting for, or gating on, the grammar mask and queueing its upload); the book's "advance"
(matchers) and "poll" (compiles, ended streams); the core's "schedule". Counts: turns of the
loop, the steps they scheduled, the streams and tokens they scheduled, how many had grammar rows or prompt tokens
(mixed steps), and the wall time of the turns. Nothing is synchronized beyond what the loop
waits for itself, so "wait" near zero means the host is the bottleneck. And the thread's own
scheduling (Linux, /proc/thread-self): its CPU time, the time it sat runnable but not running
(run_delay: other threads had its core) and how often it was preempted, over the same span: a
host phase that takes longer than its work may be waiting for a core, or for the GIL (then
neither CPU time nor run_delay counts it).

Used by `python -m rtp_llm.tools.profile_host` (offline) and by the server with --host_profile,
which logs one line per burst of work (EngineLoop: a line when the engine goes idle), so a load
test's point and the offline profile of the same step compare phase by phase."""

import time
from collections import defaultdict
from typing import Dict, Tuple

from rtp_llm.async_decoder_engine.grammar import MaskFill

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
        runner, book, core = engine.runner, engine.grammar, engine.core
        for name in _RUNNER:
            self._wrap(runner, name, name)
        self._wrap(book, "advance", "advance")
        self._wrap(book, "poll", "poll")
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
        engine.step = self._timed("turn", engine.step, lambda _: self.counts.__setitem__("turns", self.counts["turns"] + 1))

    def _timed(self, name, call, after=None):
        totals = self.totals

        def timed(*args):
            t = time.perf_counter()
            try:
                out = call(*args)
            finally:
                totals[name] += time.perf_counter() - t
            if after is not None:
                after(out)
            return out
        return timed

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
        self.totals.clear()
        self.counts.clear()
        self._sched = _thread_sched()

    def report(self) -> dict:
        """The totals since the last reset: counts, and each phase's ms per scheduled step."""
        steps = max(self.counts.get("steps", 0), 1)
        per = {k: round(v / steps * 1e3, 3) for k, v in sorted(self.totals.items())}
        cpu, delay, preempted = (now - then for now, then in zip(_thread_sched(), self._sched))
        return {**dict(sorted(self.counts.items())), "wall_s": round(self.totals.get("turn", 0.0), 3),
                "host_ms_per_step": per, "thread": {"cpu_ms_per_step": round(cpu / steps * 1e3, 3),
                                                    "run_delay_ms_per_step": round(delay / steps * 1e3, 3),
                                                    "preempted": preempted}}

    def detach(self):
        MaskFill.result = self._mask_result
        for obj, attr in self._patched:
            delattr(obj, attr)  # (the instance attribute shadowed the class's method)
        self._engine.__dict__.pop("step", None)
        self._patched.clear()
