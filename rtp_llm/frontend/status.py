"""Status routes: /health (and /status), /worker_status, /cache_status, /metrics, /tokenize,
/openapi.json. /health is also where a stalled engine loop is detected."""

import logging
import time
from typing import List, Optional, Tuple

from aiohttp import web

from rtp_llm.frontend.backend_client import BackendError
from rtp_llm.frontend.errors import ErrorCode, error_response
from rtp_llm.frontend.metrics import histogram_lines
from rtp_llm.frontend.openapi import openapi_spec
from rtp_llm.frontend.request import read_json

log = logging.getLogger(__name__)


# The engine's grammar counters (WorkerStatusPB), as /worker_status and /metrics show them.
GRAMMAR_STATS = {
    "grammar_requests": "streams that had a grammar (structured output)",
    "grammar_cache_hits": "of those, whose grammar was compiled or compiling already",
    "grammar_compiles": "grammars compiled",
    "grammar_compile_us": "their compile time summed, microseconds",
    "grammar_failures": "grammars that did not compile, or not in time",
}


# The engine's speculative-decoding counters (WorkerStatusPB), as /worker_status and /metrics show them.
SPEC_STATS = {
    "spec_draft_rounds": "stream-steps that verified drafted tokens (speculative decoding)",
    "spec_draft_tokens": "tokens drafted and verified",
    "spec_accepted_tokens": "of those, accepted",
}


# Prefill/decode disaggregation's counters (WorkerStatusPB): /worker_status shows them; /metrics
# as rtp_llm_kv_transfer_* (kv_transfer_metrics).
KV_TRANSFER_STATS = {
    "kv_exports": "requests whose KV blocks this PREFILL instance keeps for a decode instance now",
    "kv_exported_blocks": "KV blocks kept for decode instances, since start",
    "kv_imported_blocks": "KV blocks this DECODE instance read from PREFILL instances, since start",
    "kv_import_bytes": "their bytes",
    "kv_import_us": "the reads' time summed, microseconds",
    "kv_imports": "reads, one per request handed over",
    "kv_import_failures": "reads that failed (those prompts were recomputed)",
}


def kv_transfer_metrics(w) -> List[str]:
    """The issue's names: blocks by direction; the reads' seconds and bytes as histograms (the
    engine's buckets, bounds and counts both from WorkerStatusPB); failures."""
    return ["# HELP rtp_llm_kv_transfer_blocks_total KV blocks handed over: send (kept for a decode instance to "
            "read) or recv (read from a prefill instance)",
            "# TYPE rtp_llm_kv_transfer_blocks_total counter",
            f'rtp_llm_kv_transfer_blocks_total{{direction="send"}} {w.kv_exported_blocks}',
            f'rtp_llm_kv_transfer_blocks_total{{direction="recv"}} {w.kv_imported_blocks}',
            *histogram_lines("rtp_llm_kv_transfer_seconds", "time of each read from a prefill instance",
                             w.kv_read_seconds_bounds, w.kv_read_seconds_counts, w.kv_import_us / 1e6),
            *histogram_lines("rtp_llm_kv_transfer_bytes", "bytes of each read from a prefill instance",
                             w.kv_read_bytes_bounds, w.kv_read_bytes_counts, w.kv_import_bytes),
            "# HELP rtp_llm_kv_transfer_failures_total reads from prefill instances that failed (prompt recomputed)",
            "# TYPE rtp_llm_kv_transfer_failures_total counter",
            f"rtp_llm_kv_transfer_failures_total {w.kv_import_failures}"]


class StatusRoutes:
    def __init__(self, frontend):
        self.fe = frontend
        self._progress: Optional[Tuple[int, float]] = None  # (engine steps, when first seen) while work is pending

    async def health(self, request):
        problem = await self.health_problem()
        if problem is None:
            return web.Response(text='"ok"', content_type="application/json")
        return error_response(503, ErrorCode.UNKNOWN_ERROR, problem, False)

    async def health_problem(self) -> Optional[str]:
        """None when serving; else why not: draining, the backend unreachable (dead), or an
        engine loop that has made no step for engine_stall_timeout_s while work is pending."""
        fe = self.fe
        if fe.draining:
            return "the server is shutting down"
        try:
            # wait_for_ready: right after the backend comes up, this frontend's channel may still
            # be connecting while another frontend already answers 200; failing at once would
            # make /health flap between frontends (a dead backend costs the 2 s timeout).
            w = await fe.client.worker_status(timeout=2.0, wait_for_ready=True)
        except Exception:
            return "the engine is not reachable (the backend process is down or not started)"
        fe.ready = True
        fe.learn_limits(w)
        peer = await fe.client.peer_problem()  # a PREFILL instance's decode instance
        if peer is not None:
            return peer
        pending = w.running_query_len + w.waiting_query_len
        now = time.monotonic()
        if not pending:
            self._progress = None
            return None
        if self._progress is None or self._progress[0] != w.iterate_count:
            self._progress = (w.iterate_count, now)  # the clock starts at the last step seen
        stalled = now - self._progress[1]
        if fe.stall_timeout and stalled > fe.stall_timeout:
            return f"the engine loop has made no step for {stalled:.0f} s with {pending} requests pending"
        return None

    async def openapi(self, request):
        return web.json_response(openapi_spec(self.fe.model_name))

    async def worker_status(self, request):
        s = await self.fe.client.worker_status(wait_for_ready=True)  # (this frontend's channel may still connect)
        return web.json_response({"alive": s.alive, "running_query_len": s.running_query_len,
                                  "waiting_query_len": s.waiting_query_len, "iterate_count": s.iterate_count,
                                  "available_kv_cache": s.available_kv_cache, "total_kv_cache": s.total_kv_cache,
                                  "max_seq_len": s.max_seq_len, "generated_tokens": s.generated_tokens,
                                  **{name: getattr(s, name) for name in GRAMMAR_STATS},
                                  **{name: getattr(s, name) for name in SPEC_STATS},
                                  **{name: getattr(s, name) for name in KV_TRANSFER_STATS},
                                  "frontend_in_flight": self.fe.in_flight})

    async def cache_status(self, request):
        s = await self.fe.client.cache_status()
        return web.json_response({"available_kv_cache": s.available_kv_cache, "total_kv_cache": s.total_kv_cache,
                                  "block_size": s.block_size})

    async def metrics(self, request):
        gauges = {"rtp_llm_frontend_in_flight": ("requests in flight in this frontend", self.fe.in_flight)}
        counters: List[str] = []
        try:
            w, c = await self.fe.client.worker_status(), await self.fe.client.cache_status()
            gauges.update({
                "rtp_llm_running_streams": ("streams being generated", w.running_query_len),
                "rtp_llm_waiting_streams": ("streams waiting for admission", w.waiting_query_len),
                "rtp_llm_kv_cache_usage": ("fraction of KV cache tokens in use",
                                           1 - c.available_kv_cache / max(c.total_kv_cache, 1)),
                "rtp_llm_prefix_cache_hit_rate": ("prompt tokens served by the prefix cache / looked up",
                                                  c.hit_tokens / max(c.lookup_tokens, 1)),
                **{f"rtp_llm_{name}_total": (text, getattr(w, name)) for name, text in GRAMMAR_STATS.items()},
                **{f"rtp_llm_{name}_total": (text, getattr(w, name)) for name, text in SPEC_STATS.items()},
                "rtp_llm_spec_acceptance_rate": ("drafted tokens accepted / drafted, since start",
                                                 w.spec_accepted_tokens / max(w.spec_draft_tokens, 1)),
                "rtp_llm_spec_accepted_tokens_per_step": ("drafted tokens accepted per stream-step that verified "
                                                          "drafts, since start",
                                                          w.spec_accepted_tokens / max(w.spec_draft_rounds, 1)),
            })
            counters = kv_transfer_metrics(w)
        except BackendError:
            pass
        except Exception:  # the engine is down: frontend metrics are still worth serving
            log.warning("metrics: the backend did not answer")
        return web.Response(text=self.fe.stats.render(gauges, counters), content_type="text/plain")

    async def tokenize(self, request):
        body = await read_json(request)
        ids = self.fe.prompts.encode(body.get("prompt"), "prompt")
        return web.json_response({"token_ids": ids, "offset_mapping": None})
