"""One request's sequences, from token ids to text events: each sequence is one engine
request (backend_client), detokenized incrementally with its stop strings applied (a stop
string cancels the request); n > 1 sequences run concurrently and their events interleave."""

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator, List, Optional, Sequence

from rtp_llm.config.generate_config import GenerateConfig
from rtp_llm.frontend.backend_client import BackendClient
from rtp_llm.frontend.detokenizer import IncrementalDetokenizer


@dataclass
class SequenceEvent:
    index: int             # which of the n sequences
    delta: str             # new text (never a broken character, never part of a stop string; may be "")
    finished: bool
    finish_reason: Optional[str] = None  # "stop" | "length" when finished
    aux: dict = field(default_factory=dict)
    num_tokens: int = 0
    # (token id, log-prob, alternatives [(id, log-prob)] or None) of the tokens this event
    # covers, when the request asked for log-probs.
    logprobs: List[tuple] = field(default_factory=list)
    token_ids: List[int] = field(default_factory=list)  # the tokens this event covers
    # The sequence's first event, when the request asked prompt_logprobs: the prompt's
    # (token id, log-prob, alternatives or None), the first token's log-prob None.
    prompt_logprobs: Optional[List[tuple]] = None


@dataclass(frozen=True)
class Streaming:
    """How a sequence's events are paced. stream False: one event, at the end (the engine
    sends one message; stop strings still need every token, so it streams those). interval:
    an event carries at least this many tokens (vLLM's --stream-interval), except the first
    and the last, which are never delayed."""

    stream: bool = True
    interval: int = 1


def generate_sequences(client: BackendClient, tokenizer, prompt_ids: List[int], config: GenerateConfig,
                       stop: Sequence[str] = (), print_stop_words: bool = False, request_id: int = 0,
                       pacing: Streaming = Streaming(), skip_special_tokens: bool = True
                       ) -> AsyncIterator[SequenceEvent]:
    def one(index: int) -> AsyncIterator[SequenceEvent]:
        detok = IncrementalDetokenizer(tokenizer, stop, print_stop_words, skip_special_tokens=skip_special_tokens)
        request = config.to_proto(index)
        request.is_streaming = pacing.stream or bool(detok.stop)
        prompt = prompt_ids if config.prompt_logprobs is not None else None
        return _sequence(client.generate(prompt_ids, request, request_id), detok, index, pacing, prompt)

    if config.num_return_sequences == 1:
        return one(0)
    return _interleaved([one(i) for i in range(config.num_return_sequences)])


def _prompt_pairs(prompt_ids: List[int], chunk) -> List[tuple]:
    """The prompt's (token id, log-prob, alternatives) from the chunk carrying them (a one-token
    prompt has none but its first token's, None)."""
    lps = chunk.prompt_logprobs or []
    tops = chunk.prompt_top_logprobs or [None] * len(lps)
    return [(prompt_ids[0], None, None)] + list(zip(prompt_ids[1:], lps, tops))


async def _sequence(chunks, detok: IncrementalDetokenizer, index: int, pacing: Streaming,
                    prompt_ids: Optional[List[int]] = None) -> AsyncIterator[SequenceEvent]:
    """The events of one sequence. Everything that arrived together goes in one event, text or
    not.
    prompt_ids: given when the request asked prompt_logprobs (they come with the first tokens)."""
    text, pairs, held, sent = "", [], [], False  # not yet in an event: text, log-probs, token ids
    reason, aux = "stop", {}  # a stop string, unless the core says otherwise
    prompt = None  # the prompt's pairs, until an event carries them
    try:
        async for chunk in chunks:
            aux = chunk.aux
            if prompt_ids is not None and prompt is None and not sent and (
                    chunk.new_ids or chunk.finished or chunk.prompt_logprobs is not None):
                prompt = _prompt_pairs(prompt_ids, chunk)
            if chunk.logprobs is not None:
                pairs += zip(chunk.new_ids, chunk.logprobs, chunk.top_logprobs or [None] * len(chunk.new_ids))
            text += detok.add(chunk.new_ids)
            held += chunk.new_ids
            if detok.stopped:
                break  # a stop string: closing `chunks` cancels the request
            if chunk.finished:
                text += detok.finish()
                reason = chunk.finish_reason
                break
            # Tokens whose text is held (a character's first bytes, a stop string's first
            # characters) still make an event, with empty text, as vLLM's do: a client sees
            # every token when it comes, with its log-probs.
            if held and pacing.stream and (not sent or len(held) >= pacing.interval):
                yield SequenceEvent(index, text, False, aux=aux, num_tokens=len(detok.ids), logprobs=pairs,
                                    token_ids=held, prompt_logprobs=prompt)
                text, pairs, held, sent, prompt = "", [], [], True, None
        if prompt_ids is not None and prompt is None and not sent:  # ended before any output
            prompt = [(prompt_ids[0], None, None)]
        yield SequenceEvent(index, text, True, reason, aux, len(detok.ids), pairs, held, prompt_logprobs=prompt)
    finally:
        await chunks.aclose()


async def _interleaved(sequences: List[AsyncIterator[SequenceEvent]]) -> AsyncIterator[SequenceEvent]:
    """n sequences at once, their events as they come."""
    queue: asyncio.Queue = asyncio.Queue()

    async def run(events):
        try:
            async for ev in events:
                queue.put_nowait(ev)
        except Exception as e:  # BackendError, or a bug: the consumer raises it instead of waiting forever
            queue.put_nowait(e)
        finally:
            await events.aclose()

    tasks = [asyncio.create_task(run(s)) for s in sequences]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item.finished:
                remaining -= 1
            yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
