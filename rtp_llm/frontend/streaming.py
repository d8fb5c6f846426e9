"""Streaming and collecting a generation's events: the SSE framing, starting a streamed
response only once the first event is in, errors after the start as a last event, and the
clamped-max_new_tokens marks."""

import json
import logging
from typing import AsyncIterator, Dict, Optional, Tuple

from aiohttp import web

from rtp_llm.frontend.backend_client import BackendError
from rtp_llm.frontend.errors import ErrorCode, error_body

log = logging.getLogger(__name__)

# Set when max_new_tokens was lowered to fit the context (the value it ran with).
CLAMP_HEADER = "X-Max-New-Tokens-Clamped"


def clamp_header(clamped: Optional[int]) -> Dict[str, str]:
    return {CLAMP_HEADER: str(clamped)} if clamped is not None else {}


def with_clamp(aux: dict, clamped: Optional[int]) -> dict:
    return dict(aux, clamped_max_new_tokens=clamped) if clamped is not None else aux


def sse(payload, openai: bool) -> bytes:
    """One server-sent event: upstream's native API writes `data:{...}`, OpenAI's `data: {...}`."""
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data:{' ' if openai else ''}{text}\n\n".encode()


def sse_done(openai: bool) -> bytes:
    return sse("[DONE]" if openai else "[done]", openai)


async def open_stream(request: web.Request, events: AsyncIterator, clamped: Optional[int]
                      ) -> Tuple[web.StreamResponse, AsyncIterator]:
    """Waits for the first event before sending the headers, so that an error before it (the
    waiting queue is full, a parameter the engine refused) is still a plain HTTP error.
    Returns the started response and all the events."""
    first = await anext(events)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       **clamp_header(clamped)})
    await resp.prepare(request)

    async def chain():
        yield first
        async for ev in events:
            yield ev

    return resp, chain()


class stream_errors:
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
            body = error_body(500, ErrorCode.UNKNOWN_ERROR, "internal error", self.openai)
        await self.resp.write(sse(body, self.openai))
        return True
