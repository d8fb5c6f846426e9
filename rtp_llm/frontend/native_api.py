"""Upstream RTP-LLM's native API, POST /: {prompt | prompt_batch | messages, generate_config}
-> {response, finished, aux_info}, or server-sent events of those with yield_generator."""

import asyncio
import math
from typing import Any, Dict, List, Optional, Tuple

from aiohttp import web

from rtp_llm.frontend.errors import RequestError
from rtp_llm.frontend.request import (MAX_SEQUENCES_PER_REQUEST, check_logit_bias, flag, grammar_namer, native_config,
                                     native_name, read_json, stop_strings)
from rtp_llm.frontend.streaming import clamp_header, open_stream, sse, sse_done, stream_errors, with_clamp


class Upstream:
    """One sequence's extras that upstream's options ask for: output_ids and input_ids in the
    response, aux_info.cum_log_probs ([their sum]) and softmax_probs (each token's probability);
    and generate_config.prompt_logprobs' aux_info.prompt_logprobs (per prompt token, the first's
    null) and, with k > 0, prompt_top_logprobs (per prompt token [[id, log-prob]] best first)."""

    def __init__(self, options: Dict[str, Any]):
        self.options = options
        self.ids: List[int] = []
        self.logprobs: List[float] = []
        self.prompt: Optional[List[tuple]] = None

    def add(self, ev) -> None:
        self.ids += ev.token_ids
        self.logprobs += [lp for _, lp, _ in ev.logprobs]
        if ev.prompt_logprobs is not None:
            self.prompt = ev.prompt_logprobs

    def aux(self, aux: dict) -> dict:
        if self.prompt is not None:
            aux = dict(aux, prompt_logprobs=[lp for _, lp, _ in self.prompt])
            if any(top is not None for _, _, top in self.prompt):
                aux["prompt_top_logprobs"] = [None if top is None else [[t, lp] for t, lp in top]
                                              for _, _, top in self.prompt]
        if self.options.get("return_cum_log_probs"):
            aux = dict(aux, cum_log_probs=[math.fsum(self.logprobs)])
        if self.options.get("return_softmax_probs"):
            aux = dict(aux, softmax_probs=[math.exp(lp) for lp in self.logprobs])
        return aux

    def response(self, body: dict, prompt_ids: List[int], ids: Optional[List[int]] = None) -> dict:
        """body with output_ids (`ids`, else all so far) and input_ids, as asked."""
        if self.options.get("return_output_ids"):
            body["output_ids"] = list(self.ids if ids is None else ids)
        if self.options.get("return_input_ids"):
            body["input_ids"] = list(prompt_ids)
        return body

    @staticmethod
    def responses(seqs: List["Upstream"], body: dict, prompt_ids: List[int]) -> dict:
        """n sequences' body: output_ids a list per sequence."""
        body = seqs[0].response(body, prompt_ids)
        if "output_ids" in body:
            body["output_ids"] = [list(s.ids) for s in seqs]
        return body


class NativeApi:
    def __init__(self, frontend):
        self.fe = frontend

    async def generate(self, request):
        body = await read_json(request)
        config, options = native_config(body)
        check_logit_bias(config, self.fe.prompts.vocab_size, native_name)
        config = self.fe.thinking_budget(config)
        if options.get("return_cum_log_probs") or options.get("return_softmax_probs"):
            config.return_logprobs = True
        ids, fields = self._prompts(body, config.num_return_sequences, options)
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

    def _prompts(self, body: Dict[str, Any], n: int, options: Dict[str, Any]) -> Tuple[List[List[int]], List[str]]:
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
            kwargs = body.get("chat_template_kwargs") or options.get("chat_template_kwargs") or {}
            return [prompts.chat_ids(body["messages"], kwargs)], ["messages"]
        if "prompt" in body:
            return [prompts.encode(body["prompt"], "prompt")], ["prompt"]
        raise RequestError("prompt", "is required (or prompt_batch, or messages)")

    def _events(self, prompt_ids, config, stop, options, field, stream: bool):
        skip = options.get("skip_special_tokens")
        return self.fe.events(prompt_ids, config, stop, options.get("print_stop_words"), field,
                              grammar_namer(config), stream, skip_special_tokens=skip is not False)

    async def _collect(self, prompt_ids, config, clamped, stop, options, field):
        n = config.num_return_sequences
        texts, aux, seqs = [""] * n, [{}] * n, [Upstream(options) for _ in range(n)]
        async for ev in self._events(prompt_ids, config, stop, options, field, stream=False):
            texts[ev.index] += ev.delta
            seqs[ev.index].add(ev)
            if ev.finished:
                aux[ev.index] = seqs[ev.index].aux(with_clamp(ev.aux, clamped))
        if n == 1:
            return seqs[0].response({"response": texts[0], "finished": True, "aux_info": aux[0]}, prompt_ids)
        return Upstream.responses(seqs, {"response": texts, "finished": True, "aux_info": aux}, prompt_ids)

    async def _stream(self, request, prompt_ids, config, clamped, stop, options, field):
        """One event per SequenceEvent: the sequence's text so far (or only the new text with
        return_incremental) at its index, "finished" once all sequences are."""
        incremental = bool(options.get("return_incremental"))
        n = config.num_return_sequences
        texts, finished, seqs = [""] * n, [False] * n, [Upstream(options) for _ in range(n)]
        source = self._events(prompt_ids, config, stop, options, field, stream=True)
        try:
            resp, events = await open_stream(request, source, clamped)
            async with stream_errors(resp, openai=False):
                async for ev in events:
                    texts[ev.index] += ev.delta
                    finished[ev.index] = finished[ev.index] or ev.finished
                    seq = seqs[ev.index]
                    seq.add(ev)
                    out = ev.delta if incremental else texts[ev.index]
                    body = {"response": out if n == 1 else [out if i == ev.index else "" for i in range(n)],
                            "finished": all(finished), "aux_info": seq.aux(with_clamp(ev.aux, clamped))}
                    await resp.write(sse(seq.response(body, prompt_ids, ev.token_ids if incremental else None),
                                         openai=False))
                await resp.write(sse_done(openai=False))
        finally:
            await source.aclose()  # ends the gRPC calls whatever happened
        await resp.write_eof()
        return resp
