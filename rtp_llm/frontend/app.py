"""The HTTP frontend (aiohttp): upstream's native API and the OpenAI API, over the engine's
gRPC RpcService. Thin: parse and validate, tokenize, stream, format."""

import asyncio
import dataclasses
import hmac
import itertools
import json
import logging
import math
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from aiohttp import web

from rtp_llm.config.generate_config import GenerateConfig, GenerateConfigError
from rtp_llm.frontend.backend_client import BackendClient, BackendError
from rtp_llm.frontend.errors import (CONCURRENCY_LIMIT_ERROR, ERROR_INPUT_FORMAT_ERROR, UNKNOWN_ERROR, RequestError, error_body,
                                     error_response)
from rtp_llm.frontend.generation import generate_sequences
from rtp_llm.frontend.metrics import Metrics
from rtp_llm.frontend.openapi import openapi_spec

log = logging.getLogger(__name__)

# Native generate_config keys that the frontend handles itself (not engine parameters).
_FRONTEND_KEYS = ("stop_words_str", "print_stop_words", "return_incremental", "yield_generator", "is_streaming")


_INT32 = (1 << 31) - 1
# What the int32 proto fields and the sampler's fp32 arithmetic can take (GenerateConfig checks
# signs and types; beyond these a value overflows the proto or turns logits into inf/nan).
_RANGES = {"max_new_tokens": (1, _INT32), "min_new_tokens": (0, _INT32), "top_k": (0, _INT32),
           "timeout_ms": (0, _INT32), "random_seed": (0, (1 << 63) - 65),  # + the sequence index, in an int64
           "temperature": (0, 1e4), "repetition_penalty": (0.01, 100), "presence_penalty": (-2, 2),
           "frequency_penalty": (-2, 2)}
_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
# Sequences one request may start (prompt_batch x num_return_sequences).
MAX_SEQUENCES_PER_REQUEST = 64
# Engine error codes -> the request field they are about.
_BACKEND_FIELDS = {511: "prompt", 607: "prompt", 603: "timeout_ms"}


def _make_config(d: Dict[str, Any], name) -> GenerateConfig:
    """GenerateConfig from request fields, also rejecting what it accepts but the engine cannot
    take; `name` maps a GenerateConfig field to the request's name for it."""
    for key in _FLOATS:
        v = d.get(key, 0.5)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or abs(v) > 1e300 or not math.isfinite(v):
            raise RequestError(name(key), f"must be a finite number, got {v!r}")
    if not isinstance(d.get("stop_words_list", []), list):
        raise RequestError(name("stop_words_list"), "must be a list of token id lists")
    try:
        config = GenerateConfig.from_dict(d)
    except GenerateConfigError as e:
        raise RequestError(name(e.field), str(e).split(": ", 1)[-1]) from None
    except TypeError as e:  # a wrong type GenerateConfig did not check
        raise RequestError(name(""), str(e)) from None
    for key, (lo, hi) in _RANGES.items():
        v = getattr(config, key)
        if v is not None and not lo <= v <= hi:
            raise RequestError(name(key), f"must be in [{lo}, {hi}], got {v!r}")
    for key in ("ignore_eos", "return_logprobs"):
        if not isinstance(getattr(config, key), bool):
            raise RequestError(name(key), "must be a boolean")
    if any(not -_INT32 <= t <= _INT32 for w in config.stop_words_list for t in w):
        raise RequestError(name("stop_words_list"), "token ids must fit in int32")
    return config


def _flag(d: Dict[str, Any], key: str, field: str) -> bool:
    """An optional boolean field (null = false)."""
    v = d.get(key)
    if v is not None and not isinstance(v, bool):
        raise RequestError(field, f"must be a boolean, got {v!r}")
    return bool(v)


def _native_config(body: Dict[str, Any]) -> Dict[str, Any]:
    cfg = body.get("generate_config", {})
    if not isinstance(cfg, dict):
        raise RequestError("generate_config", "must be an object")
    merged = {k: v for k, v in body.items() if k in GenerateConfig.__dataclass_fields__ or k in _FRONTEND_KEYS}
    merged.update(cfg)
    return merged


def _split(config: Dict[str, Any]):
    frontend = {k: config.pop(k) for k in _FRONTEND_KEYS if k in config}
    for k in ("print_stop_words", "return_incremental", "yield_generator", "is_streaming"):
        _flag(frontend, k, f"generate_config.{k}")
    return _make_config(config, lambda k: f"generate_config.{k}" if k else "generate_config"), frontend


# Set when max_new_tokens was lowered to fit the context (the value it ran with).
CLAMP_HEADER = "X-Max-New-Tokens-Clamped"


def _clamp_header(clamped: Optional[int]) -> Dict[str, str]:
    return {CLAMP_HEADER: str(clamped)} if clamped is not None else {}


def _with_clamp(aux: dict, clamped: Optional[int]) -> dict:
    return dict(aux, clamped_max_new_tokens=clamped) if clamped is not None else aux


class _stream_errors:
    """After a streaming response has started, an error can no longer change the status: it
    goes out as a last event with the usual JSON error body, and the stream ends."""

    def __init__(self, resp: web.StreamResponse, openai: bool):
        self.resp, self.openai = resp, openai

    async def __aenter__(self):
        return self

    async def __aexit__(self, kind, e, tb):
        if e is None or not isinstance(e, Exception) or isinstance(e, ConnectionError):
            return False  # success, cancellation (client gone) or a dead connection
        if isinstance(e, BackendError):
            body = error_body(e.http_status, e.error_code, e.message, self.openai)
        else:
            log.error("streaming response failed", exc_info=(kind, e, tb))
            body = error_body(500, UNKNOWN_ERROR, "internal error", self.openai)
        await self.resp.write(f"data:{' ' if self.openai else ''}{json.dumps(body)}\n\n".encode())
        return True


class Frontend:
    def __init__(self, tokenizer, client: BackendClient, model_name: str, concurrency_limit: int,
                 api_key: Optional[str] = None, max_body_size: int = 8 << 20, default_timeout_ms: int = 0,
                 engine_stall_timeout_s: float = 60):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer) if tokenizer is not None else 0
        self.max_body_size = max_body_size
        self.default_timeout_ms = default_timeout_ms
        self.stall_timeout = engine_stall_timeout_s
        self.context_len: Optional[int] = None  # min(max_seq_len, KV capacity): a stream's longest length
        self._progress: Optional[Tuple[int, float]] = None  # (engine steps, when first seen) while work is pending
        self.api_key = api_key
        self.client = client
        self.model_name = model_name
        self.limit = concurrency_limit
        self.in_flight = 0
        self.ready = False     # the backend has answered a health check
        self.draining = False  # SIGTERM: finish requests in flight, refuse new ones (503)
        self.ids = itertools.count(1)
        self.stats = Metrics()

    # ---- plumbing ---------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_size, middlewares=[self._errors, self._auth])
        app.add_routes([
            web.get("/health", self.health), web.get("/status", self.health), web.post("/health", self.health),
            web.get("/openapi.json", self.openapi),
            web.post("/", self.native), web.post("/tokenize", self.tokenize),
            web.get("/worker_status", self.worker_status), web.get("/cache_status", self.cache_status),
            web.get("/metrics", self.metrics),
            web.get("/v1/models", self.models),
            web.post("/v1/completions", self.completions), web.post("/v1/chat/completions", self.chat),
        ])
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        openai = request.path.startswith("/v1")
        try:
            resp = await handler(request)
        except RequestError as e:
            headers = {"Retry-After": "1"} if e.status == 429 else None
            resp = error_response(e.status, e.error_code, str(e), openai, e.field or None, headers)
        except BackendError as e:
            headers = {"Retry-After": "1"} if e.http_status == 429 else None
            resp = error_response(e.http_status, e.error_code, e.message, openai, self._backend_field(e), headers)
        except web.HTTPRequestEntityTooLarge:
            resp = error_response(413, ERROR_INPUT_FORMAT_ERROR,
                                  f"body: larger than the limit of {self.max_body_size} bytes", openai, "body")
        except web.HTTPException as e:
            resp = error_response(e.status, UNKNOWN_ERROR, e.reason, openai)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("internal error on %s", request.path)
            resp = error_response(500, UNKNOWN_ERROR, "internal error", openai)
        route = request.match_info.route.resource
        self.stats.count(request.method, route.canonical if route else "unknown", resp.status)
        return resp

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self.api_key and request.path not in ("/health", "/status"):
            header = request.headers.get("Authorization", "")
            given = header[7:] if header.startswith("Bearer ") else request.headers.get("X-API-Key", "")
            if not hmac.compare_digest(given.encode(), self.api_key.encode()):
                raise RequestError("Authorization", "missing or wrong API key (Authorization: Bearer <key>)", 401)
        return await handler(request)

    @staticmethod
    def _backend_field(e: BackendError) -> Optional[str]:
        if e.error_code == 605:  # INVALID_PARAMS: the engine's message starts with the field
            return e.message.split(" ", 1)[0]
        return _BACKEND_FIELDS.get(e.error_code)

    async def _json(self, request: web.Request) -> Dict[str, Any]:
        try:
            # Bytes, not text: json detects UTF-8/16/32 itself, whatever charset the header claims.
            body = json.loads(await request.read())
        except (ValueError, RecursionError) as e:  # bad JSON or encoding, digits beyond int's limit, deep nesting
            raise RequestError("body", f"not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
        if not isinstance(body, dict):
            raise RequestError("body", "must be a JSON object")
        return body

    async def _admit(self):
        if self.draining:
            raise RequestError("", "the server is shutting down", 503, UNKNOWN_ERROR)
        if not self.ready:
            # This frontend's channel may still be connecting while another frontend already
            # answered /health: give it a moment rather than refusing the request.
            self.ready = await self.client.health(timeout=5.0, wait_for_ready=True)
            if not self.ready:
                raise RequestError("", "the engine is still starting", 503, UNKNOWN_ERROR)
        if self.context_len is None:
            self._learn_limits(await self.client.worker_status())
        if self.in_flight >= self.limit:
            raise RequestError("", f"over the concurrency limit ({self.limit} requests per frontend process)", 429,
                               CONCURRENCY_LIMIT_ERROR)
        self.in_flight += 1

    def _learn_limits(self, w) -> None:
        # The engine caps a stream at min(max_seq_len, the whole KV cache).
        self.context_len = min(w.max_seq_len, w.total_kv_cache) if w.total_kv_cache else w.max_seq_len

    def _tokenize(self, text: str, field: str, special: bool) -> List[int]:
        try:
            return list(self.tokenizer(text, add_special_tokens=special).input_ids)
        except Exception as e:  # e.g. lone surrogates, which no tokenizer can encode
            raise RequestError(field, f"cannot be tokenized ({type(e).__name__})") from None

    def _encode(self, text: Any, field: str, special: bool = True) -> List[int]:
        if isinstance(text, list) and text and all(isinstance(t, int) and not isinstance(t, bool) for t in text):
            if not all(0 <= t < self.vocab_size for t in text):
                raise RequestError(field, f"token ids must be in [0, {self.vocab_size})")
            return text
        if not isinstance(text, str) or not text:
            raise RequestError(field, "must be a non-empty string")
        return self._tokenize(text, field, special)

    def _fit(self, prompt_ids: List[int], config: GenerateConfig, field: str) -> Tuple[GenerateConfig, Optional[int]]:
        """Checks the prompt (at least one token, fewer than the context holds) and clamps
        max_new_tokens to what is left of the context; returns the config to run and the clamped
        value (None if unchanged). Also applies the server's default timeout and caps top_k at
        the vocabulary (larger means no cap)."""
        n, limit = len(prompt_ids), self.context_len
        if n == 0:  # e.g. only control characters the tokenizer drops
            raise RequestError(field, "has no tokens once tokenized; the engine needs at least one")
        if limit is not None and n >= limit:
            raise RequestError(field, f"has {n} tokens; the context holds {limit} (max_seq_len and KV cache), "
                                      f"and room for at least one new token is needed", 400, 511)
        changes: Dict[str, Any] = {}
        if config.timeout_ms == 0 and self.default_timeout_ms:
            changes["timeout_ms"] = self.default_timeout_ms
        if config.top_k >= self.vocab_size > 0:
            changes["top_k"] = 0
        clamped = None
        if limit is not None and config.max_new_tokens > limit - n:
            clamped = changes["max_new_tokens"] = limit - n
            changes["min_new_tokens"] = min(config.min_new_tokens, clamped)
        return (dataclasses.replace(config, **changes) if changes else config), clamped

    def _chat_ids(self, messages: Any, kwargs: Dict[str, Any]) -> List[int]:
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise RequestError("messages", "must be a non-empty list of {role, content} objects")
        if not isinstance(kwargs, dict):
            raise RequestError("chat_template_kwargs", "must be an object")
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        except Exception as e:
            raise RequestError("messages", f"cannot apply the chat template: {str(e)[:200]}") from None
        return self._tokenize(text, "messages", False)

    # ---- health and status ------------------------------------------------------------
    async def health(self, request):
        problem = await self._health_problem()
        if problem is None:
            return web.Response(text='"ok"', content_type="application/json")
        return error_response(503, UNKNOWN_ERROR, problem, False)

    async def _health_problem(self) -> Optional[str]:
        """None when serving; else why not: draining, the backend unreachable (dead), or an
        engine loop that has made no step for engine_stall_timeout_s while work is pending."""
        if self.draining:
            return "the server is shutting down"
        try:
            # wait_for_ready: right after the backend comes up, this frontend's channel may still
            # be connecting while another frontend already answers 200; failing at once would
            # make /health flap between frontends (a dead backend costs the 2 s timeout).
            w = await self.client.worker_status(timeout=2.0, wait_for_ready=True)
        except Exception:
            return "the engine is not reachable (the backend process is down or not started)"
        self.ready = True
        self._learn_limits(w)
        pending = w.running_query_len + w.waiting_query_len
        now = time.monotonic()
        if not pending:
            self._progress = None
            return None
        if self._progress is None or self._progress[0] != w.iterate_count:
            self._progress = (w.iterate_count, now)  # the clock starts at the last step seen
        stalled = now - self._progress[1]
        if self.stall_timeout and stalled > self.stall_timeout:
            return f"the engine loop has made no step for {stalled:.0f} s with {pending} requests pending"
        return None

    async def openapi(self, request):
        return web.json_response(openapi_spec(self.model_name))

    async def worker_status(self, request):
        s = await self.client.worker_status()
        return web.json_response({"alive": s.alive, "running_query_len": s.running_query_len,
                                  "waiting_query_len": s.waiting_query_len, "iterate_count": s.iterate_count,
                                  "available_kv_cache": s.available_kv_cache, "total_kv_cache": s.total_kv_cache,
                                  "max_seq_len": s.max_seq_len, "frontend_in_flight": self.in_flight})

    async def cache_status(self, request):
        s = await self.client.cache_status()
        return web.json_response({"available_kv_cache": s.available_kv_cache, "total_kv_cache": s.total_kv_cache,
                                  "block_size": s.block_size})

    async def metrics(self, request):
        gauges = {"rtp_llm_frontend_in_flight": ("requests in flight in this frontend", self.in_flight)}
        try:
            w, c = await self.client.worker_status(), await self.client.cache_status()
            gauges.update({
                "rtp_llm_running_streams": ("streams being generated", w.running_query_len),
                "rtp_llm_waiting_streams": ("streams waiting for admission", w.waiting_query_len),
                "rtp_llm_kv_cache_usage": ("fraction of KV cache tokens in use",
                                           1 - c.available_kv_cache / max(c.total_kv_cache, 1)),
                "rtp_llm_prefix_cache_hit_rate": ("prompt tokens served by the prefix cache / looked up",
                                                  c.hit_tokens / max(c.lookup_tokens, 1)),
            })
        except BackendError:
            pass
        except Exception:  # the engine is down: frontend metrics are still worth serving
            log.warning("metrics: the backend did not answer")
        return web.Response(text=self.stats.render(gauges), content_type="text/plain")

    async def _timed(self, events):
        """Passes events through, recording TTFT, inter-token latency and e2e latency."""
        start = last = time.perf_counter()
        first = True
        try:
            async for ev in events:
                if ev.delta:
                    now = time.perf_counter()
                    if first:
                        self.stats.ttft.observe(now - start)
                        first = False
                    else:
                        self.stats.itl.observe(now - last)
                    last = now
                yield ev
        finally:
            await events.aclose()  # closed early: the sequences' gRPC calls end now, not at garbage collection
        self.stats.e2e.observe(time.perf_counter() - start)

    async def tokenize(self, request):
        body = await self._json(request)
        ids = self._encode(body.get("prompt"), "prompt")
        return web.json_response({"token_ids": ids, "offset_mapping": None})

    # ---- native API -------------------------------------------------------------------
    async def native(self, request):
        body = await self._json(request)
        config, fe = _split(_native_config(body))
        if "prompt_batch" in body:
            prompts = body["prompt_batch"]
            if not isinstance(prompts, list) or not prompts:
                raise RequestError("prompt_batch", "must be a non-empty list of strings")
            if len(prompts) * config.num_return_sequences > MAX_SEQUENCES_PER_REQUEST:
                raise RequestError("prompt_batch", f"{len(prompts)} prompts x num_return_sequences "
                                                   f"{config.num_return_sequences} is over {MAX_SEQUENCES_PER_REQUEST} "
                                                   f"sequences per request")
            fields = [f"prompt_batch[{i}]" for i in range(len(prompts))]
            ids = [self._encode(p, f) for p, f in zip(prompts, fields)]
        elif "messages" in body:
            fields = ["messages"]
            ids = [self._chat_ids(body["messages"], body.get("chat_template_kwargs") or {})]
        elif "prompt" in body:
            fields = ["prompt"]
            ids = [self._encode(body["prompt"], "prompt")]
        else:
            raise RequestError("prompt", "is required (or prompt_batch, or messages)")
        stop = fe.get("stop_words_str") or []
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise RequestError("generate_config.stop_words_str", "must be a list of strings")
        streaming = fe.get("yield_generator") or _flag(body, "stream", "stream") or fe.get("is_streaming")
        if streaming and len(ids) > 1:
            raise RequestError("prompt_batch", "cannot be streamed; send one prompt per request")
        await self._admit()
        try:
            runs = [self._fit(p, config, f) for p, f in zip(ids, fields)]
            if streaming:
                return await self._native_stream(request, ids[0], *runs[0], stop, fe)
            results = await asyncio.gather(*[self._native_one(p, c, clamped, stop, fe)
                                             for p, (c, clamped) in zip(ids, runs)])
            headers = _clamp_header(runs[0][1]) if len(ids) == 1 else None
            return web.json_response(results if "prompt_batch" in body else results[0], headers=headers)
        finally:
            self.in_flight -= 1

    def _events(self, prompt_ids, config, stop, print_stop_words=False):
        return self._timed(generate_sequences(self.client, self.tokenizer, prompt_ids, config, stop,
                                              print_stop_words, next(self.ids)))

    async def _native_one(self, prompt_ids, config, clamped, stop, fe):
        n = config.num_return_sequences
        texts, aux = [""] * n, [{}] * n
        async for ev in self._events(prompt_ids, config, stop, fe.get("print_stop_words")):
            texts[ev.index] += ev.delta
            if ev.finished:
                aux[ev.index] = _with_clamp(ev.aux, clamped)
        if n == 1:
            return {"response": texts[0], "finished": True, "aux_info": aux[0]}
        return {"response": texts, "finished": True, "aux_info": aux}

    @staticmethod
    async def _open_stream(request, events, clamped):
        """Waits for the first event before sending the headers, so that an error before it
        (the waiting queue is full, a parameter the engine refused) is still a plain HTTP error.
        Returns the started response and all the events."""
        first = await anext(events)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           **_clamp_header(clamped)})
        await resp.prepare(request)

        async def chain():
            yield first
            async for ev in events:
                yield ev

        return resp, chain()

    async def _native_stream(self, request, prompt_ids, config, clamped, stop, fe):
        incremental = bool(fe.get("return_incremental"))
        n = config.num_return_sequences
        texts, finished = [""] * n, [False] * n
        source = self._events(prompt_ids, config, stop, fe.get("print_stop_words"))
        try:
            resp, events = await self._open_stream(request, source, clamped)
            async with _stream_errors(resp, openai=False):
                async for ev in events:
                    texts[ev.index] += ev.delta
                    finished[ev.index] = finished[ev.index] or ev.finished
                    out = ev.delta if incremental else texts[ev.index]
                    body = {"response": out if n == 1 else [out if i == ev.index else "" for i in range(n)],
                            "finished": all(finished), "aux_info": _with_clamp(ev.aux, clamped)}
                    await resp.write(f"data:{json.dumps(body)}\n\n".encode())
                await resp.write(b"data:[done]\n\n")
        finally:
            await source.aclose()  # ends the gRPC calls whatever happened
        await resp.write_eof()
        return resp

    # ---- OpenAI API -------------------------------------------------------------------
    async def models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "rtp_llm"}]})

    def _openai_config(self, body: Dict[str, Any], default_max: Optional[int]) -> GenerateConfig:
        cfg: Dict[str, Any] = {}
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", default_max))
        if max_tokens is not None:
            cfg["max_new_tokens"] = max_tokens
        for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                             ("min_p", "min_p"), ("presence_penalty", "presence_penalty"),
                             ("frequency_penalty", "frequency_penalty"), ("repetition_penalty", "repetition_penalty"),
                             ("random_seed", "seed"), ("num_return_sequences", "n"), ("ignore_eos", "ignore_eos")):
            if body.get(theirs) is not None:
                cfg[ours] = body[theirs]
        names = {"max_new_tokens": "max_tokens", "random_seed": "seed", "num_return_sequences": "n"}
        return _make_config(cfg, lambda k: names.get(k, k or "body"))

    @staticmethod
    def _logprobs_wanted(body, chat: bool) -> bool:
        top = body.get("top_logprobs") if chat else body.get("logprobs")
        if chat and body.get("logprobs") not in (None, False, True):
            raise RequestError("logprobs", "must be a boolean")
        if top not in (None, 0, False, True) and not (isinstance(top, int) and top >= 0):
            raise RequestError("top_logprobs" if chat else "logprobs", "must be a non-negative integer")
        if isinstance(top, int) and not isinstance(top, bool) and top > (0 if chat else 1):
            raise RequestError("top_logprobs" if chat else "logprobs",
                               "alternatives are not supported: only the chosen token's log-prob is returned")
        return bool(body.get("logprobs")) if chat else body.get("logprobs") is not None

    def _logprobs(self, pairs, chat: bool):
        tokens = [self.tokenizer.decode([t]) for t, _ in pairs]
        if chat:
            return {"content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
                                for tok, (_, lp) in zip(tokens, pairs)]}
        return {"tokens": tokens, "token_logprobs": [lp for _, lp in pairs], "top_logprobs": None,
                "text_offset": None}

    @staticmethod
    def _stop(body) -> List[str]:
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 16:
            raise RequestError("stop", "must be a string or a list of at most 16 strings")
        return stop

    async def completions(self, request):
        body = await self._json(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        ids = self._encode(prompt, "prompt")
        return await self._openai(request, body, ids, chat=False, default_max=16)

    async def chat(self, request):
        body = await self._json(request)
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise RequestError("chat_template_kwargs", "must be an object")
        ids = self._chat_ids(body.get("messages"), kwargs)
        return await self._openai(request, body, ids, chat=True, default_max=None)

    async def _openai(self, request, body, prompt_ids, chat: bool, default_max: Optional[int]):
        config = self._openai_config(body, default_max)
        want_logprobs = self._logprobs_wanted(body, chat)
        config.return_logprobs = want_logprobs
        stop = self._stop(body)
        stream = _flag(body, "stream", "stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise RequestError("stream_options", "must be an object")
        include_usage = _flag(options, "include_usage", "stream_options.include_usage")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        await self._admit()
        source = None
        try:
            config, clamped = self._fit(prompt_ids, config, "messages" if chat else "prompt")
            events = source = self._events(prompt_ids, config, stop)
            if not stream:
                n = config.num_return_sequences
                texts, reasons, tokens = [""] * n, ["stop"] * n, [0] * n
                pairs: List[list] = [[] for _ in range(n)]
                async for ev in events:
                    texts[ev.index] += ev.delta
                    pairs[ev.index] += ev.logprobs
                    if ev.finished:
                        reasons[ev.index], tokens[ev.index] = ev.finish_reason, ev.num_tokens
                lps = [self._logprobs(p, chat) if want_logprobs else None for p in pairs]
                choices = [({"index": i, "message": {"role": "assistant", "content": texts[i]},
                             "finish_reason": reasons[i], "logprobs": lps[i]} if chat else
                            {"index": i, "text": texts[i], "finish_reason": reasons[i], "logprobs": lps[i]})
                           for i in range(n)]
                usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": sum(tokens),
                         "total_tokens": len(prompt_ids) + sum(tokens)}
                return web.json_response({"id": rid, "object": obj, "created": created, "model": self.model_name,
                                          "choices": choices, "usage": usage}, headers=_clamp_header(clamped))
            resp, events = await self._open_stream(request, source, clamped)
            chunk_obj = "chat.completion.chunk" if chat else "text_completion"

            async def send(choices, usage=None):
                payload = {"id": rid, "object": chunk_obj, "created": created, "model": self.model_name,
                           "choices": choices}
                if include_usage:
                    payload["usage"] = usage
                await resp.write(f"data: {json.dumps(payload)}\n\n".encode())

            async with _stream_errors(resp, openai=True):
                if chat:
                    for i in range(config.num_return_sequences):
                        await send([{"index": i, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None}])
                completion_tokens = 0
                async for ev in events:
                    if ev.finished:
                        completion_tokens += ev.num_tokens
                    if not ev.delta and not ev.finished:
                        continue
                    reason = ev.finish_reason if ev.finished else None
                    lp = self._logprobs(ev.logprobs, chat) if want_logprobs else None
                    choice = ({"index": ev.index, "delta": {"content": ev.delta} if ev.delta else {},
                               "finish_reason": reason, "logprobs": lp} if chat else
                              {"index": ev.index, "text": ev.delta, "finish_reason": reason, "logprobs": lp})
                    await send([choice])
                if include_usage:
                    await send([], {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens,
                                    "total_tokens": len(prompt_ids) + completion_tokens})
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            if source is not None:
                await source.aclose()  # ends the gRPC calls whatever happened
            self.in_flight -= 1
