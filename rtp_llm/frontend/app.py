"""The HTTP frontend (aiohttp): upstream's native API and the OpenAI API, over the engine's
gRPC RpcService. Thin: parse and validate, tokenize, stream, format.

A streaming chat request, hop by hop:
  POST /v1/chat/completions -> middleware.py (auth, then errors -> JSON bodies)
  -> openai_api.OpenAIApi.chat: prompts.Prompts.chat_ids (chat template, tokenizer) and
     request.openai_config (GenerateConfig, validated as declared in config/generate_config.py)
  -> Frontend.admitted (draining, readiness, concurrency limit) and Frontend.fit (context)
  -> Frontend.events -> generation.generate_sequences: one backend_client.BackendClient.generate
     per sequence (a tagged request on the frontend's one multiplexed gRPC call,
     FrontendStreamService), detokenizer.IncrementalDetokenizer on each
  <- SequenceEvents (each with every token that arrived together) -> streaming.open_stream
     (headers once the first event is in), one SSE event per event (streaming.sse), errors
     after the start by streaming.stream_errors.
The other routes: native_api.py (POST /), status.py (/health, /status, /worker_status,
/cache_status, /metrics, /tokenize, /openapi.json)."""

import contextlib
import dataclasses
import itertools
from typing import List, Optional, Sequence, Tuple

from aiohttp import web

from rtp_llm.config.generate_config import GenerateConfig
from rtp_llm.frontend.backend_client import BackendClient, BackendError
from rtp_llm.frontend.errors import ErrorCode, RequestError
from rtp_llm.frontend.generation import Streaming, generate_sequences
from rtp_llm.frontend.metrics import Metrics
from rtp_llm.frontend.middleware import auth_middleware, error_middleware
from rtp_llm.frontend.native_api import NativeApi
from rtp_llm.frontend.openai_api import OpenAIApi
from rtp_llm.frontend.prompts import Prompts, fit
from rtp_llm.config.output_parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, ThinkTags
from rtp_llm.frontend.request import Namer
from rtp_llm.frontend.status import StatusRoutes


class Frontend:
    """One frontend process's state: the backend client, the tokenizer, the limits learned
    from the engine, requests in flight and metrics. The routes live in NativeApi, OpenAIApi
    and StatusRoutes, which share it."""

    def __init__(self, tokenizer, client: BackendClient, model_name: str, concurrency_limit: int,
                 api_key: Optional[str] = None, max_body_size: int = 8 << 20, default_timeout_ms: int = 0,
                 engine_stall_timeout_s: float = 60, stream_interval: int = 1, reasoning_parser: str = "",
                 tool_call_parser: str = ""):
        self.tokenizer = tokenizer
        self.prompts = Prompts(tokenizer)
        self.max_body_size = max_body_size
        self.default_timeout_ms = default_timeout_ms
        self.stall_timeout = engine_stall_timeout_s
        self.stream_interval = stream_interval
        self.reasoning = REASONING_PARSERS[reasoning_parser] if reasoning_parser else None  # chat's <think> tags
        self.tool_calls = TOOL_CALL_PARSERS[tool_call_parser] if tool_call_parser else None  # and <tool_call>s
        self.context_len: Optional[int] = None  # min(max_seq_len, KV capacity): a stream's longest length
        self.api_key = api_key
        self.client = client
        self.model_name = model_name
        self.limit = concurrency_limit
        self.in_flight = 0
        self.ready = False     # the backend has answered a health check
        self.draining = False  # SIGTERM: finish requests in flight, refuse new ones (503)
        self.ids = itertools.count(1)
        self.stats = Metrics()
        self.status = StatusRoutes(self)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_size,
                              middlewares=[error_middleware(self), auth_middleware(self.api_key)])
        native, openai, status = NativeApi(self), OpenAIApi(self), self.status
        app.add_routes([
            web.get("/health", status.health), web.get("/status", status.health), web.post("/health", status.health),
            web.get("/openapi.json", status.openapi),
            web.post("/", native.generate), web.post("/tokenize", status.tokenize),
            web.get("/worker_status", status.worker_status), web.get("/cache_status", status.cache_status),
            web.get("/metrics", status.metrics),
            web.get("/v1/models", openai.models),
            web.post("/v1/completions", openai.completions), web.post("/v1/chat/completions", openai.chat),
            web.post("/chat/completions", openai.chat),  # upstream's route
        ])
        return app

    @contextlib.asynccontextmanager
    async def admitted(self):
        """Holds a place among the requests in flight, or refuses the request: 503 while
        draining or before the engine answers, 429 over the concurrency limit."""
        if self.draining:
            raise RequestError("", "the server is shutting down", 503, ErrorCode.UNKNOWN_ERROR)
        if not self.ready:
            # This frontend's channel may still be connecting while another frontend already
            # answered /health: give it a moment rather than refusing the request.
            self.ready = await self.client.health(timeout=5.0, wait_for_ready=True)
            if not self.ready:
                raise RequestError("", "the engine is still starting", 503, ErrorCode.UNKNOWN_ERROR)
        if self.context_len is None:
            self.learn_limits(await self.client.worker_status())
        if self.in_flight >= self.limit:
            raise RequestError("", f"over the concurrency limit ({self.limit} requests per frontend process)", 429,
                               ErrorCode.CONCURRENCY_LIMIT_ERROR)
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    def learn_limits(self, w) -> None:
        # The engine caps a stream at min(max_seq_len, the whole KV cache).
        self.context_len = min(w.max_seq_len, w.total_kv_cache) if w.total_kv_cache else w.max_seq_len

    def fit(self, prompt_ids: List[int], config: GenerateConfig, field: str,
            fill: bool = False) -> Tuple[GenerateConfig, Optional[int]]:
        """prompts.fit against this engine's context and the server's defaults."""
        return fit(prompt_ids, config, field, self.context_len, self.default_timeout_ms, self.prompts.vocab_size,
                   fill)

    async def events(self, prompt_ids: List[int], config: GenerateConfig, stop: Sequence[str],
                     print_stop_words: bool, prompt_field: str, name: Namer, stream: bool,
                     skip_special_tokens: bool = True):
        """The SequenceEvents of one prompt's sequences, timed into the metrics (stream False:
        one per sequence, at its end). An engine error leaves with its `param` set to the
        request's name for the field it is about (prompt_field for the prompt's token ids,
        name() of a generate_config key)."""
        pacing = Streaming(stream, self.stream_interval)
        source = self.stats.timed(generate_sequences(self.client, self.tokenizer, prompt_ids, config, stop,
                                                     print_stop_words, next(self.ids), pacing, skip_special_tokens))
        try:
            async for ev in source:
                yield ev
        except BackendError as e:
            e.param = prompt_field if e.field == "token_ids" else name(e.field) if e.field else None
            raise
        finally:
            await source.aclose()  # closed early: the sequences' gRPC calls end now

    def thinking_budget(self, config: GenerateConfig, thinking: bool = True) -> GenerateConfig:
        """A thinking budget (max_thinking_tokens > 0) starts the output inside the thinking
        (in_think_mode, unless `thinking` is off: a chat with enable_thinking false), which ends at
        end_think_token_ids: by default the tokens of the reasoning parser's end tag."""
        if config.max_thinking_tokens <= 0:
            return config
        end = config.end_think_token_ids or self.prompts.tokenize((self.reasoning or ThinkTags()).end,
                                                                  "end_think_token_ids", False)
        return dataclasses.replace(config, in_think_mode=thinking, end_think_token_ids=end)

    def _chat_ids(self, messages, kwargs) -> List[int]:
        """Prompts.chat_ids (kept on Frontend: tests/test_server.py renders templates with it)."""
        return self.prompts.chat_ids(messages, kwargs)
