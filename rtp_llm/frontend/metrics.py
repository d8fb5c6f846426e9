"""Prometheus text-format metrics of one frontend process (no client library needed)."""

import bisect
import time
from typing import AsyncIterator, Dict, List, Sequence, Tuple

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: Sequence[float] = _LATENCY_BUCKETS):
        self.name, self.help = name, help_text
        self.buckets = list(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def render(self) -> List[str]:
        return histogram_lines(self.name, self.help, self.buckets, self.counts, self.sum)


def histogram_lines(name: str, help_text: str, bounds: Sequence[float], counts: Sequence[int],
                    total: float) -> List[str]:
    """A histogram in Prometheus' text format: counts per bucket (not cumulative), one more than
    bounds (the last is +Inf's), and the values' sum."""
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{name}: {len(counts)} bucket counts for {len(bounds)} bounds (want bounds + 1)")
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    seen = 0
    for bound, n in zip(list(bounds) + [float("inf")], counts):
        seen += n
        le = "+Inf" if bound == float("inf") else repr(float(bound))
        lines.append(f'{name}_bucket{{le="{le}"}} {seen}')
    return lines + [f"{name}_sum {total}", f"{name}_count {seen}"]


class Metrics:
    def __init__(self):
        self.requests: Dict[Tuple[str, str, int], int] = {}
        self.ttft = Histogram("rtp_llm_time_to_first_token_seconds", "time to the first generated text")
        self.itl = Histogram("rtp_llm_inter_token_latency_seconds", "time between streamed text chunks")
        self.e2e = Histogram("rtp_llm_e2e_request_latency_seconds", "request latency, first byte in to last out")

    def count(self, method: str, path: str, status: int) -> None:
        key = (method, path, status)
        self.requests[key] = self.requests.get(key, 0) + 1

    async def timed(self, events: AsyncIterator) -> AsyncIterator:
        """Passes a request's SequenceEvents through, recording TTFT, inter-token latency and
        e2e latency."""
        start = last = time.perf_counter()
        first = True
        try:
            async for ev in events:
                if ev.delta:
                    now = time.perf_counter()
                    if first:
                        self.ttft.observe(now - start)
                        first = False
                    else:
                        self.itl.observe(now - last)
                    last = now
                yield ev
        finally:
            await events.aclose()  # closed early: the sequences' gRPC calls end now, not at garbage collection
        self.e2e.observe(time.perf_counter() - start)

    def render(self, gauges: Dict[str, Tuple[str, float]], lines_after: Sequence[str] = ()) -> str:
        """This frontend's metrics, the engine's gauges, then lines_after (rendered already)."""
        lines = ["# HELP rtp_llm_http_requests_total HTTP requests by route and status",
                 "# TYPE rtp_llm_http_requests_total counter"]
        for (method, path, status), n in sorted(self.requests.items()):
            lines.append(f'rtp_llm_http_requests_total{{method="{method}",path="{path}",status="{status}"}} {n}')
        for h in (self.ttft, self.itl, self.e2e):
            lines += h.render()
        for name, (help_text, value) in sorted(gauges.items()):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
        return "\n".join([*lines, *lines_after]) + "\n"
