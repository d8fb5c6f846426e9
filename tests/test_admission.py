"""256 concurrent clients are all admitted by the default server on a small machine: with the
default --concurrency_limit (per frontend process) and the default frontend count (one on 2
cores), 256 streaming /v1/completions requests all get 200 and complete; the engine queues
what it cannot run yet."""

import asyncio
import json

import pytest
from testlib import sse_events, sse_payload, start_server, stop_server

CLIENTS = 256
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def server(smollm2):
    from rtp_llm.config.server_config import default_frontend_server_count

    proc, base = start_server(smollm2, frontends=default_frontend_server_count())  # the launcher's default
    yield base
    assert stop_server(proc) == 0


async def _stream(session, base: str, i: int):
    """(HTTP status, completion tokens from the usage event or None, the last event)."""
    body = {"model": "m", "prompt": f"Request {i}: count 1, 2, 3,", "max_tokens": MAX_TOKENS, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    async with session.post(base + "/v1/completions", json=body) as r:
        text = await r.text()
        if r.status != 200:
            return r.status, None, text
    events = [sse_payload(e) for e in sse_events(text)]
    usage = json.loads(events[-2]).get("usage") if len(events) >= 2 else None
    return 200, usage and usage["completion_tokens"], events[-1]


async def _all(base: str):
    import aiohttp

    # No connection cap (aiohttp's default is 100): every client is in flight at once.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=900)) as session:
        return await asyncio.gather(*(_stream(session, base, i) for i in range(CLIENTS)))


def test_256_concurrent_streaming_clients_are_all_admitted_and_complete(server):
    results = asyncio.run(_all(server))
    refused = [r for r in results if r[0] != 200]
    assert not refused, f"{len(refused)} of {CLIENTS} not admitted, e.g. {refused[0]}"
    assert all(tokens == MAX_TOKENS and last == "[DONE]" for _, tokens, last in results), results[:3]
