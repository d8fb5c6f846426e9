"""The HTTP frontend (aiohttp): upstream's native API and the OpenAI API, over the engine's
gRPC RpcService. Thin: parse and validate, tokenize, stream, format."""

import asyncio
import hmac
import itertools
import json
import logging
import time
import uuid
from typing import Any, Dict, List, Optional

from aiohttp import web

from rtp_llm.config.generate_config import GenerateConfig, GenerateConfigError
from rtp_llm.frontend.backend_client import BackendClient, BackendError
from rtp_llm.frontend.errors import CONCURRENCY_LIMIT_ERROR, UNKNOWN_ERROR, RequestError, error_response
from rtp_llm.frontend.generation import generate_sequences
from rtp_llm.frontend.metrics import Metrics

log = logging.getLogger(__name__)

# Native generate_config keys that the frontend handles itself (not engine parameters).
_FRONTEND_KEYS = ("stop_words_str", "print_stop_words", "return_incremental", "yield_generator", "is_streaming")


def _native_config(body: Dict[str, Any]) -> Dict[str, Any]:
    cfg = body.get("generate_config", {})
    if not isinstance(cfg, dict):
        raise RequestError("generate_config", "must be an object")
    merged = {k: v for k, v in body.items() if k in GenerateConfig.__dataclass_fields__ or k in _FRONTEND_KEYS}
    merged.update(cfg)
    return merged


def _split(config: Dict[str, Any]):
    frontend = {k: config.pop(k) for k in _FRONTEND_KEYS if k in config}
    try:
        return GenerateConfig.from_dict(config), frontend
    except GenerateConfigError as e:
        raise RequestError(f"generate_config.{e.field}", str(e).split(": ", 1)[-1]) from None
    except TypeError as e:
        raise RequestError("generate_config", str(e)) from None


class Frontend:
    def __init__(self, tokenizer, client: BackendClient, model_name: str, concurrency_limit: int,
                 api_key: Optional[str] = None):
        self.tokenizer = tokenizer
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
        app = web.Application(client_max_size=8 << 20, middlewares=[self._errors, self._auth])
        app.add_routes([
            web.get("/health", self.health), web.get("/status", self.health), web.post("/health", self.health),
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
            resp = error_response(e.http_status, e.error_code, e.message, openai)
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

    async def _json(self, request: web.Request) -> Dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError("body", f"not valid JSON ({e})") from None
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
        if self.in_flight >= self.limit:
            raise RequestError("", f"over the concurrency limit ({self.limit} requests per frontend process)", 429,
                               CONCURRENCY_LIMIT_ERROR)
        self.in_flight += 1

    def _encode(self, text: Any, field: str, special: bool = True) -> List[int]:
        if isinstance(text, list) and all(isinstance(t, int) for t in text) and text:
            return text
        if not isinstance(text, str) or not text:
            raise RequestError(field, "must be a non-empty string")
        return list(self.tokenizer(text, add_special_tokens=special).input_ids)

    def _chat_ids(self, messages: Any, kwargs: Dict[str, Any]) -> List[int]:
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise RequestError("messages", "must be a non-empty list of {role, content} objects")
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        except Exception as e:
            raise RequestError("messages", f"cannot apply the chat template: {e}") from None
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    # ---- health and status ------------------------------------------------------------
    async def health(self, request):
        if not self.draining and await self.client.health():
            self.ready = True
            return web.Response(text='"ok"', content_type="application/json")
        return error_response(503, UNKNOWN_ERROR, "the engine is not serving", False)

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
            ids = [self._encode(p, f"prompt_batch[{i}]") for i, p in enumerate(prompts)]
        elif "messages" in body:
            ids = [self._chat_ids(body["messages"], body.get("chat_template_kwargs") or {})]
        elif "prompt" in body:
            ids = [self._encode(body["prompt"], "prompt")]
        else:
            raise RequestError("prompt", "is required (or prompt_batch, or messages)")
        stop = fe.get("stop_words_str") or []
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise RequestError("generate_config.stop_words_str", "must be a list of strings")
        streaming = bool(fe.get("yield_generator") or body.get("stream") or fe.get("is_streaming"))
        if streaming and len(ids) > 1:
            raise RequestError("prompt_batch", "cannot be streamed; send one prompt per request")
        await self._admit()
        try:
            if streaming:
                return await self._native_stream(request, ids[0], config, stop, fe)
            results = await asyncio.gather(*[self._native_one(p, config, stop, fe) for p in ids])
            return web.json_response(results if "prompt_batch" in body else results[0])
        finally:
            self.in_flight -= 1

    async def _native_one(self, prompt_ids, config, stop, fe):
        n = config.num_return_sequences
        texts, aux = [""] * n, [{}] * n
        async for ev in self._timed(generate_sequences(self.client, self.tokenizer, prompt_ids, config, stop,
                                                       bool(fe.get("print_stop_words")), next(self.ids))):
            texts[ev.index] += ev.delta
            if ev.finished:
                aux[ev.index] = ev.aux
        if n == 1:
            return {"response": texts[0], "finished": True, "aux_info": aux[0]}
        return {"response": texts, "finished": True, "aux_info": aux}

    async def _native_stream(self, request, prompt_ids, config, stop, fe):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        incremental = bool(fe.get("return_incremental"))
        n = config.num_return_sequences
        texts, finished = [""] * n, [False] * n
        async for ev in self._timed(generate_sequences(self.client, self.tokenizer, prompt_ids, config, stop,
                                                       bool(fe.get("print_stop_words")), next(self.ids))):
            texts[ev.index] += ev.delta
            finished[ev.index] = finished[ev.index] or ev.finished
            out = ev.delta if incremental else texts[ev.index]
            body = {"response": out if n == 1 else [out if i == ev.index else "" for i in range(n)],
                    "finished": all(finished), "aux_info": ev.aux}
            await resp.write(f"data:{json.dumps(body)}\n\n".encode())
        await resp.write(b"data:[done]\n\n")
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
        try:
            return GenerateConfig.from_dict(cfg)
        except GenerateConfigError as e:
            names = {"max_new_tokens": "max_tokens", "random_seed": "seed", "num_return_sequences": "n"}
            raise RequestError(names.get(e.field, e.field), str(e).split(": ", 1)[-1]) from None
        except TypeError as e:
            raise RequestError("body", str(e)) from None

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
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        await self._admit()
        try:
            events = self._timed(generate_sequences(self.client, self.tokenizer, prompt_ids, config, stop, False,
                                                    next(self.ids)))
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
                                          "choices": choices, "usage": usage})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            chunk_obj = "chat.completion.chunk" if chat else "text_completion"

            async def send(choices, usage=None):
                payload = {"id": rid, "object": chunk_obj, "created": created, "model": self.model_name,
                           "choices": choices}
                if include_usage:
                    payload["usage"] = usage
                await resp.write(f"data: {json.dumps(payload)}\n\n".encode())

            if chat:
                for i in range(config.num_return_sequences):
                    await send([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
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
            self.in_flight -= 1
