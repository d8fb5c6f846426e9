"""One client process of rtp_llm.tools.bench_serve: its own event loop and an uncapped
connection pool (one connection per concurrent stream), its share of the prompts and of the
concurrency. It waits at the shared barrier so that every client process starts together,
then reports its per-request results and its own CPU time (user + sys) over its run."""

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import aiohttp

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "native": "/"}
BARRIER_TIMEOUT_S = 300  # every client process must be up by then (spawn + imports)


@dataclass
class Result:
    ok: bool
    e2e: float = 0.0
    ttft: float = 0.0
    itl: List[float] = field(default_factory=list)  # between consecutive chunks, as vLLM's client
    chunks: int = 0  # SSE chunks that carried a choice
    output_tokens: int = 0
    prompt_tokens: int = 0
    engine_time: Optional[float] = None  # native: aux_info.cost_time (s)
    error: str = ""


@dataclass
class Shard:
    """What one client process drives: `requests` are (prompt token ids, output length)."""
    base_url: str
    endpoint: str
    model: str
    requests: List[Tuple[List[int], int]]
    concurrency: int
    request_rate: float  # this process's share of the Poisson arrival rate (0: all at once)
    timeout: float
    seed: int
    json_schema: Optional[dict] = None  # every request's output follows it (structured output)


@dataclass
class ShardReport:
    results: List[Result]
    start: float  # time.time() when the barrier released this process
    end: float
    cpu_s: float  # user + sys CPU seconds of this process between start and end


async def completions(session, url: str, model: str, prompt_ids, output_len: int, chat: bool,
                      json_schema: Optional[dict] = None) -> Result:
    body = {"model": model, "max_tokens": output_len, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if json_schema is not None:  # vLLM's field, which both servers take
        body["structured_outputs"] = {"json": json_schema}
    if chat:
        body["messages"] = [{"role": "user", "content": " ".join(str(t) for t in prompt_ids)}]
    else:
        body["prompt"] = prompt_ids  # token ids: the prompt is exactly input_len tokens
    start = time.perf_counter()
    last, r = start, Result(ok=False)
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            return Result(ok=False, error=f"{resp.status}: {(await resp.text())[:200]}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                return Result(ok=False, error=f"stream error: {json.dumps(chunk['error'])[:200]}")
            if chunk.get("usage"):
                r.output_tokens = chunk["usage"]["completion_tokens"]
                r.prompt_tokens = chunk["usage"]["prompt_tokens"]
            if chunk.get("choices"):
                now = time.perf_counter()
                if r.chunks == 0:
                    r.ttft = now - start
                else:
                    r.itl.append(now - last)
                last = now
                r.chunks += 1
    r.e2e = time.perf_counter() - start
    if not r.output_tokens:
        return Result(ok=False, error="the stream carried no usage (stream_options.include_usage)")
    r.ok = True
    return r


async def native(session, url: str, prompt_ids, output_len: int, json_schema: Optional[dict] = None) -> Result:
    body = {"prompt": prompt_ids, "generate_config": {"max_new_tokens": output_len, "temperature": 0,
                                                       "ignore_eos": True}}
    if json_schema is not None:
        body["generate_config"]["json_schema"] = json_schema
    start = time.perf_counter()
    async with session.post(url, json=body) as resp:
        text = await resp.text()
        if resp.status != 200:
            return Result(ok=False, error=f"{resp.status}: {text[:200]}")
    e2e = time.perf_counter() - start
    aux = json.loads(text)["aux_info"]
    return Result(ok=True, e2e=e2e, ttft=aux["first_token_cost_time"] / 1000.0, output_tokens=aux["output_len"],
                  prompt_tokens=aux["input_len"], engine_time=aux["cost_time"] / 1000.0)


async def _drive(shard: Shard, barrier) -> ShardReport:
    url = shard.base_url.rstrip("/") + PATHS[shard.endpoint]
    rng = random.Random(shard.seed)
    limit = asyncio.Semaphore(shard.concurrency)
    results: List[Result] = []
    # limit=0: no cap on connections (aiohttp's default of 100 would serialise the streams
    # beyond it); a stream holds its connection until its response ends.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=shard.timeout)) as s:
        async def one(prompt, out_len):
            async with limit:
                try:
                    if shard.endpoint == "native":
                        results.append(await native(s, url, prompt, out_len, shard.json_schema))
                    else:
                        results.append(await completions(s, url, shard.model, prompt, out_len,
                                                         shard.endpoint == "chat", shard.json_schema))
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                    results.append(Result(ok=False, error=repr(e)[:200]))

        barrier.wait(BARRIER_TIMEOUT_S)  # blocks the loop on purpose: nothing runs before the start
        start, cpu = time.time(), time.process_time()
        tasks = []
        for prompt, out_len in shard.requests:
            tasks.append(asyncio.create_task(one(prompt, out_len)))
            if shard.request_rate > 0:
                await asyncio.sleep(rng.expovariate(shard.request_rate))
        await asyncio.gather(*tasks)
        end, cpu_s = time.time(), time.process_time() - cpu
    return ShardReport(results=results, start=start, end=end, cpu_s=cpu_s)


def client_main(shard: Shard, barrier, out_queue) -> None:
    """A client process's entry point (multiprocessing, spawn): its ShardReport goes on out_queue."""
    out_queue.put(asyncio.run(_drive(shard, barrier)))
