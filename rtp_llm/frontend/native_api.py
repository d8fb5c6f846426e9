"""Upstream RTP-LLM's native API, POST /: {prompt | prompt_batch | messages, generate_config}
-> {response, finished, aux_info}, or server-sent events of those with yield_generator."""

import asyncio
from typing import Any, Dict, List, Tuple

from aiohttp import web

from rtp_llm.frontend.errors import RequestError
from rtp_llm.frontend.request import (MAX_SEQUENCES_PER_REQUEST, check_logit_bias, flag, native_config, native_name,
                                     read_json, stop_strings)
from rtp_llm.frontend.streaming import clamp_header, open_stream, sse, sse_done, stream_errors, with_clamp


class NativeApi:
    def __init__(self, frontend):
        self.fe = frontend

    async def generate(self, request):
        body = await read_json(request)
        config, options = native_config(body)
        check_logit_bias(config, self.fe.prompts.vocab_size, native_name)
        ids, fields = self._prompts(body, config.num_return_sequences)
        stop = stop_strings(options)
        streaming = options.get("yield_generator") or flag(body, "stream", "stream") or options.get("is_streaming")
        if streaming and len(ids) > 1:
            raise RequestError("prompt_batch", "cannot be streamed; send one prompt per request")
        async with self.fe.admitted():
            runs = [self.fe.fit(p, config, f) for p, f in zip(ids, fields)]
            if streaming:
                return await self._stream(request, ids[0], *runs[0], stop, options, fields[0])
            results = await asyncio.gather(*[self._collect(p, c, clamped, stop, options, f)
                                             for p, (c, clamped), f in zip(ids, runs, fields)])
            headers = clamp_header(runs[0][1]) if len(ids) == 1 else None
            return web.json_response(results if "prompt_batch" in body else results[0], headers=headers)

    def _prompts(self, body: Dict[str, Any], n: int) -> Tuple[List[List[int]], List[str]]:
        """The prompts' token ids and the request field each came from."""
        prompts = self.fe.prompts
        if "prompt_batch" in body:
            batch = body["prompt_batch"]
            if not isinstance(batch, list) or not batch:
                raise RequestError("prompt_batch", "must be a non-empty list of strings")
            if len(batch) * n > MAX_SEQUENCES_PER_REQUEST:
                raise RequestError("prompt_batch", f"{len(batch)} prompts x num_return_sequences {n} is over "
                                                   f"{MAX_SEQUENCES_PER_REQUEST} sequences per request")
            fields = [f"prompt_batch[{i}]" for i in range(len(batch))]
            return [prompts.encode(p, f) for p, f in zip(batch, fields)], fields
        if "messages" in body:
            return [prompts.chat_ids(body["messages"], body.get("chat_template_kwargs") or {})], ["messages"]
        if "prompt" in body:
            return [prompts.encode(body["prompt"], "prompt")], ["prompt"]
        raise RequestError("prompt", "is required (or prompt_batch, or messages)")

    def _events(self, prompt_ids, config, stop, options, field, stream: bool):
        return self.fe.events(prompt_ids, config, stop, options.get("print_stop_words"), field, native_name, stream)

    async def _collect(self, prompt_ids, config, clamped, stop, options, field):
        n = config.num_return_sequences
        texts, aux = [""] * n, [{}] * n
        async for ev in self._events(prompt_ids, config, stop, options, field, stream=False):
            texts[ev.index] += ev.delta
            if ev.finished:
                aux[ev.index] = with_clamp(ev.aux, clamped)
        if n == 1:
            return {"response": texts[0], "finished": True, "aux_info": aux[0]}
        return {"response": texts, "finished": True, "aux_info": aux}

    async def _stream(self, request, prompt_ids, config, clamped, stop, options, field):
        """One event per SequenceEvent: the sequence's text so far (or only the new text with
        return_incremental) at its index, "finished" once all sequences are."""
        incremental = bool(options.get("return_incremental"))
        n = config.num_return_sequences
        texts, finished = [""] * n, [False] * n
        source = self._events(prompt_ids, config, stop, options, field, stream=True)
        try:
            resp, events = await open_stream(request, source, clamped)
            async with stream_errors(resp, openai=False):
                async for ev in events:
                    texts[ev.index] += ev.delta
                    finished[ev.index] = finished[ev.index] or ev.finished
                    out = ev.delta if incremental else texts[ev.index]
                    body = {"response": out if n == 1 else [out if i == ev.index else "" for i in range(n)],
                            "finished": all(finished), "aux_info": with_clamp(ev.aux, clamped)}
                    await resp.write(sse(body, openai=False))
                await resp.write(sse_done(openai=False))
        finally:
            await source.aclose()  # ends the gRPC calls whatever happened
        await resp.write_eof()
        return resp
