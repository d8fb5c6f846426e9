"""Samples the server's GET /worker_status while a bench_serve run goes (our server: the
engine's running and waiting streams and generated_tokens, the count of tokens it has
generated since it started), so that the tokens the client received can be set beside the
tokens the engine generated over the same window. A server without the route (vLLM's) is
reported as unavailable; the run goes on."""

import json
import statistics
import threading
import time
import urllib.request
from typing import List, Optional

INTERVAL_S = 0.5


class ServerSampler:
    def __init__(self, base_url: str, interval: float = INTERVAL_S):
        self.url = base_url.rstrip("/") + "/worker_status"
        self.interval = interval
        self.samples: List[dict] = []
        self.unavailable: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _sample(self) -> Optional[dict]:
        try:
            with urllib.request.urlopen(self.url, timeout=5) as r:
                s = json.loads(r.read())
        except (OSError, ValueError) as e:  # URLError and HTTPError are OSErrors
            return {"error": f"GET {self.url}: {e}"}
        if not isinstance(s, dict) or "generated_tokens" not in s:
            return {"error": f"GET {self.url}: no generated_tokens in the answer"}
        s["t"] = time.time()
        return s

    def start(self) -> None:
        """The first sample now (call it before any request is sent: the window's tokens all
        count), then one every interval on a thread."""
        first = self._sample()
        if "error" in first:
            self.unavailable = first["error"]
            return
        self.samples.append(first)
        self._thread = threading.Thread(target=self._loop, name="worker_status sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            s = self._sample()
            if "error" not in s:
                self.samples.append(s)

    def stop(self) -> None:
        """The last sample (call it once every response has ended)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        last = self._sample()
        if "error" not in last:
            self.samples.append(last)

    def summary(self) -> dict:
        if self.unavailable is not None or len(self.samples) < 2:
            return {"available": False, "reason": self.unavailable or "fewer than two samples"}
        first, last = self.samples[0], self.samples[-1]
        inner = self.samples[1:-1] or self.samples  # the samples taken while the load ran
        running = [s["running_query_len"] for s in inner]
        waiting = [s["waiting_query_len"] for s in inner]
        generated = last["generated_tokens"] - first["generated_tokens"]
        window = last["t"] - first["t"]
        return {"available": True, "samples": len(self.samples), "window_s": window,
                "running_streams_median": statistics.median(running), "running_streams_max": max(running),
                "waiting_streams_median": statistics.median(waiting),
                "in_engine_max": max(r + w for r, w in zip(running, waiting)),
                "generated_tokens_delta": generated, "engine_output_tok_s": generated / window if window else 0.0}
