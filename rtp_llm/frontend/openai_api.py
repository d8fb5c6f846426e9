"""The OpenAI API: /v1/completions, /v1/chat/completions (both also streamed as server-sent
events) and /v1/models. The response objects' shapes are in rtp_llm/openai/protocol.py."""

from typing import Any, Callable, Dict, List, Optional, Tuple

from aiohttp import web

from rtp_llm.config.generate_config import MAX_TOP_LOGPROBS
from rtp_llm.config.grammar import GRAMMAR_FIELDS, GrammarError, openai_grammar
from rtp_llm.frontend.chat_output import AnswerSplitter
from rtp_llm.frontend.errors import RequestError
from rtp_llm.frontend.request import check_logit_bias, flag, openai_config, openai_name, read_json
from rtp_llm.frontend.streaming import clamp_header, open_stream, sse, sse_done, stream_errors
from rtp_llm.frontend.tool_calls import ForcedCalls, forced_calls, request_tools, template_messages
from rtp_llm.openai.protocol import Reply, usage


def _logprobs_wanted(body: Dict[str, Any], chat: bool) -> Tuple[bool, int]:
    """(log-probs asked for, alternatives per token). Chat: logprobs true, top_logprobs 0-20
    (which needs logprobs true); completions: logprobs N, 0-20 alternatives (OpenAI allows 5,
    vLLM 20)."""
    name = "top_logprobs" if chat else "logprobs"
    top = body.get(name)
    if chat and body.get("logprobs") not in (None, False, True):
        raise RequestError("logprobs", "must be a boolean")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise RequestError(name, f"must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top!r}"[:200])
    if not chat:
        return top is not None, top or 0
    wanted = bool(body.get("logprobs"))
    if top and not wanted:
        raise RequestError("top_logprobs", "needs logprobs: true")
    return wanted, top or 0


def _stop(body: Dict[str, Any]) -> List[str]:
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 16:
        raise RequestError("stop", "must be a string or a list of at most 16 strings")
    return stop




def _echo(body: Dict[str, Any], prompt_text: Callable[[], str]) -> str:
    """Completions' echo: the prompt's text, put before each choice's text ("" when not asked).
    With logprobs the choice's log-probs start with the prompt's (_with_prompt_logprobs)."""
    if not flag(body, "echo", "echo"):
        return ""
    return prompt_text()


def _with_prompt_logprobs(config, echo: str) -> None:
    """Echo with logprobs N: the engine computes the prompt tokens' log-probs and N alternatives
    (GenerateConfig.prompt_logprobs; the raw model distribution, as vLLM's)."""
    if echo and config.return_logprobs:
        config.prompt_logprobs = config.top_logprobs


def _refuse_unsupported(body: Dict[str, Any], chat: bool) -> None:
    """Refuses tools outside chat and echo in it."""
    if not chat:
        for key in ("tools", "tool_choice"):
            if body.get(key) not in (None, [], "none"):
                raise RequestError(key, "is a chat completions field (/v1/chat/completions)")
    elif body.get("echo") not in (None, False):
        raise RequestError("echo", "is a completions field (/v1/completions): refused rather than ignored")


def _with_grammar(config, body: Dict[str, Any], forced=None):
    """Puts the request's structured output (response_format, structured_outputs, guided_*, or
    the calls a tool_choice forces: tool_calls.ForcedCalls) on `config`; returns the request's
    names for config fields (a grammar field: the field the grammar came from, so an engine
    error about it names that)."""
    try:
        grammar, source = openai_grammar(body)
    except GrammarError as e:
        raise RequestError(e.field, e.reason) from None
    if forced is not None:
        if grammar is not None:
            raise RequestError(source, 'cannot be combined with tool_choice "required" or a named function')
        grammar, source = forced.grammar, "tools"
    if grammar is None:
        return openai_name
    setattr(config, grammar.kind, grammar.text)
    return lambda key: source if key in GRAMMAR_FIELDS else openai_name(key)


def template_kwargs(body: Dict[str, Any]) -> Dict[str, Any]:
    """The chat template's extra arguments: chat_template_kwargs, and a top-level
    enable_thinking (SGLang's and upstream's spelling) unless chat_template_kwargs sets it."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError("chat_template_kwargs", "must be an object")
    if body.get("enable_thinking") is not None:
        kwargs = {"enable_thinking": flag(body, "enable_thinking", "enable_thinking"), **kwargs}
    return kwargs


def _include_usage(body: Dict[str, Any]) -> bool:
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("stream_options", "must be an object")
    return flag(options, "include_usage", "stream_options.include_usage")


class OpenAIApi:
    def __init__(self, frontend):
        self.fe = frontend

    async def models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": self.fe.model_name, "object": "model", "created": 0, "owned_by": "rtp_llm"}]})

    async def completions(self, request):
        body = await read_json(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        ids = self.fe.prompts.encode(prompt, "prompt")
        echo = _echo(body, lambda: prompt if isinstance(prompt, str) else self.fe.tokenizer.decode(ids))
        return await self._generate(request, body, ids, chat=False, default_max=16, echo=echo)

    async def chat(self, request):
        body = await read_json(request)
        tools = request_tools(body, self.fe.tool_calls)
        ids = self.fe.prompts.chat_ids(template_messages(body.get("messages")), template_kwargs(body), tools)
        calls = forced_calls(body, tools) or (self.fe.tool_calls if tools is not None else None)
        return await self._generate(request, body, ids, chat=True, default_max=None, calls=calls)

    async def _generate(self, request, body, prompt_ids: List[int], chat: bool, default_max: Optional[int],
                        calls=None, echo: str = ""):
        """calls: how the answer's tool calls are found (the request offered tools): the
        parser's ToolCallTags, or the tool_calls.ForcedCalls its tool_choice enforces. echo:
        text before each choice's (completions' echo)."""
        _refuse_unsupported(body, chat)
        config = openai_config(body, default_max)
        name = _with_grammar(config, body, calls if isinstance(calls, ForcedCalls) else None)
        config.return_logprobs, config.top_logprobs = _logprobs_wanted(body, chat)
        _with_prompt_logprobs(config, echo)
        check_logit_bias(config, self.fe.prompts.vocab_size, openai_name)
        config = self.fe.thinking_budget(config, not chat or template_kwargs(body).get("enable_thinking") is not False)
        stop = _stop(body)
        stream = flag(body, "stream", "stream")
        include_usage = _include_usage(body)
        reply = Reply(self.fe.model_name, chat, self.fe.tokenizer if config.return_logprobs else None, echo)
        # A chat that sets no limit may use the rest of the context (as OpenAI's and vLLM's do).
        fill = chat and body.get("max_completion_tokens") is None and body.get("max_tokens") is None
        async with self.fe.admitted():
            field = "messages" if chat else "prompt"
            config, clamped = self.fe.fit(prompt_ids, config, field, fill)
            source = self.fe.events(prompt_ids, config, stop, False, field, name, stream)
            n = config.num_return_sequences
            parsers = (self.fe.reasoning if chat else None, calls)
            try:
                if not stream:
                    return await self._collect(source, reply, n, prompt_ids, clamped, parsers)
                return await self._stream(request, source, reply, n, prompt_ids, clamped, include_usage, parsers)
            finally:
                await source.aclose()  # ends the gRPC calls whatever happened

    @staticmethod
    async def _collect(events, reply: Reply, n: int, prompt_ids, clamped, parsers: tuple):
        texts, reasons, tokens = [reply.echo] * n, ["stop"] * n, [0] * n
        pairs: List[list] = [[] for _ in range(n)]
        async for ev in events:
            texts[ev.index] += ev.delta
            pairs[ev.index] += (ev.prompt_logprobs or []) + ev.logprobs
            if ev.finished:
                reasons[ev.index], tokens[ev.index] = ev.finish_reason, ev.num_tokens
        choices = []
        for i in range(n):
            piece = AnswerSplitter(*parsers).add(texts[i], last=True)
            reasoning = piece.reasoning if parsers[0] else None
            reason = "tool_calls" if piece.calls and reasons[i] == "stop" else reasons[i]
            choices.append(reply.choice(i, piece.content, reason, pairs[i], reasoning, piece.calls))
        return web.json_response(reply.completion(choices, usage(len(prompt_ids), sum(tokens))),
                                 headers=clamp_header(clamped))

    @staticmethod
    async def _stream(request, source, reply: Reply, n: int, prompt_ids, clamped, include_usage: bool,
                      parsers: tuple):
        """A chunk per event that carries tokens or ends a sequence (chat first opens each
        sequence's assistant turn); with include_usage every chunk has "usage" (null until the
        last, choice-less chunk). parsers: chat's thinking goes out as reasoning_content, its
        tool calls as tool_calls deltas (the name, then the arguments)."""
        resp, events = await open_stream(request, source, clamped)

        async def send(choices, counts=None):
            await resp.write(sse(reply.chunk(choices, counts, include_usage), openai=True))

        async with stream_errors(resp, openai=True):
            if reply.chat:
                for i in range(n):
                    await send([reply.opening_delta(i)])
            elif reply.echo and reply.tokenizer is None:  # (with log-probs: with the prompt's, below)
                for i in range(n):
                    await send([reply.delta(i, reply.echo, None, [])])
            completion_tokens = 0
            splitters = [AnswerSplitter(*parsers) for _ in range(n)]
            pairs: List[list] = [[] for _ in range(n)]  # log-probs of text not sent yet (a tag held back)
            async for ev in events:
                if ev.prompt_logprobs is not None and reply.echo:  # a sequence's first event
                    await send([reply.delta(ev.index, reply.echo, None, ev.prompt_logprobs)])
                if ev.finished:
                    completion_tokens += ev.num_tokens
                split = splitters[ev.index]
                first_call = split.num_calls
                piece = split.add(ev.delta, last=ev.finished)
                pairs[ev.index] += ev.logprobs
                for k, call in enumerate(piece.calls, first_call):
                    for part in reply.tool_call_deltas(ev.index, k, call):
                        await send([part])
                if not piece.content and not piece.reasoning and not ev.finished and ev.delta:
                    continue  # a parser holds this text back (a tag may be starting)
                reason = ev.finish_reason if ev.finished else None
                if reason == "stop" and split.num_calls:
                    reason = "tool_calls"
                await send([reply.delta(ev.index, piece.content, reason, pairs[ev.index], piece.reasoning)])
                pairs[ev.index] = []
            if include_usage:
                await send([], usage(len(prompt_ids), completion_tokens))
        await resp.write(sse_done(openai=True))  # also after an error event
        await resp.write_eof()
        return resp
