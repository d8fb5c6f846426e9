"""One request's sequences, from token ids to text events: runs n gRPC streams concurrently,
detokenizes each incrementally and applies stop strings (cancelling a stream that hit one)."""

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator, List, Optional, Sequence

from rtp_llm.config.generate_config import GenerateConfig
from rtp_llm.frontend.backend_client import BackendClient
from rtp_llm.frontend.detokenizer import IncrementalDetokenizer


@dataclass
class SequenceEvent:
    index: int             # which of the n sequences
    delta: str             # new text (never a broken character, never part of a stop string)
    finished: bool
    finish_reason: Optional[str] = None  # "stop" | "length" when finished
    aux: dict = field(default_factory=dict)
    num_tokens: int = 0
    # (token id, log-prob) of the tokens this event covers, when the request asked for them.
    logprobs: List[tuple] = field(default_factory=list)


async def generate_sequences(client: BackendClient, tokenizer, prompt_ids: List[int], config: GenerateConfig,
                             stop: Sequence[str] = (), print_stop_words: bool = False,
                             request_id: int = 0) -> AsyncIterator[SequenceEvent]:
    queue: asyncio.Queue = asyncio.Queue()

    async def run(index: int):
        detok = IncrementalDetokenizer(tokenizer, stop, print_stop_words)
        stream = client.generate(prompt_ids, config.to_proto(index), request_id)
        reason = "stop"  # a stop string, unless the core says otherwise
        aux: dict = {}
        try:
            pending: List[tuple] = []
            async for chunk in stream:
                aux = chunk.aux
                if chunk.logprobs is not None:
                    pending += list(zip(chunk.new_ids, chunk.logprobs))
                delta = detok.add(chunk.new_ids)
                if detok.stopped:
                    break  # a stop string: leaving the loop cancels the call
                if chunk.finished:
                    delta += detok.finish()
                    reason = chunk.finish_reason
                    break
                if delta:
                    await queue.put(SequenceEvent(index, delta, False, aux=aux, num_tokens=len(detok.ids),
                                                  logprobs=pending))
                    pending = []
            else:
                delta = detok.finish()
            await queue.put(SequenceEvent(index, delta, True, reason, aux, len(detok.ids), pending))
        except Exception as e:  # BackendError, or a bug: the consumer raises it instead of waiting forever
            await queue.put(e)
        finally:
            await stream.aclose()

    tasks = [asyncio.create_task(run(i)) for i in range(config.num_return_sequences)]
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
