"""Soak test of a running server (a tool, not a CI test): many mixed requests (native and
OpenAI, streaming and not, random sampling parameters, some deliberately invalid, some
cancelled by the client mid-way), then a report of every unexpected answer, the growth of the
server processes' resident memory, and whether every KV block is free at the end.

    python -m rtp_llm.tools.soak --base_url http://127.0.0.1:30000 --requests 10000 [--concurrency 8]

Expected: valid requests get a 200 with a complete answer (a stream ends with its done marker
and no error event); invalid ones get a 400 naming the field; cancelled ones end however the
cut left them. Anything else is an error. Memory is the summed RSS of the launcher
(rtp_llm.start_server on the URL's port, or --server_pid) and its children, measured once the
first 5 % of the requests are done (allocators and caches warmed up) and again at the end."""

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from typing import Dict, List, Optional
from urllib.parse import urlparse

import aiohttp

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Write a haiku about the sea.", "1, 2, 3, 4,",
           "Explain what a hash map is.", "Once upon a time", "Translate 'good morning' to Spanish.", "SELECT"]
INVALID = [  # (path, body): each must be a 400
    ("/", {"prompt": "hi", "generate_config": {"top_p": 2}}),
    ("/", {"generate_config": {"max_new_tokens": 4}}),
    ("/", {"prompt": "hi", "generate_config": {"max_new_tokens": -1}}),
    ("/v1/chat/completions", {"messages": "hi"}),
    ("/v1/completions", {"prompt": "hi", "n": 1000}),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}),
]


def _server_processes(base_url: str, pid: Optional[int]) -> list:
    try:
        import psutil  # not a dependency of the wheel: without it, no memory figures
    except ImportError:
        print("psutil is not installed: RSS is not measured", file=sys.stderr)
        return []
    port = urlparse(base_url).port
    if pid is None:
        for p in psutil.process_iter(["cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if "rtp_llm.start_server" in cmd and f"--start_port={port}" in cmd:
                pid = p.pid
                break
    if pid is None:
        return []
    root = psutil.Process(pid)
    return [root] + root.children(recursive=True)


def _rss(procs: list) -> Dict[str, int]:
    out = {}
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
            name = next((m for m in ("start_backend_server", "start_frontend_server", "start_server") if m in cmd),
                        p.name())
            out[f"{name}[{p.pid}]"] = p.memory_info().rss
        except Exception:  # psutil.NoSuchProcess: a process that is gone has no memory to report
            pass
    return out


def _valid_request(rng: random.Random, max_new_tokens: int = 16):
    """(path, body, streaming) of a random valid request."""
    route = rng.choice(["native", "native", "chat", "completions"])
    stream = rng.random() < 0.5
    n = rng.choice([1, 1, 1, 2, 3])
    params = {"temperature": rng.choice([0, 0.7, 1.0, 1.3]), "top_p": rng.choice([1.0, 0.9, 0.5]),
              "top_k": rng.choice([0, 0, 20, 100000])}
    if rng.random() < 0.3:
        params["seed" if route != "native" else "random_seed"] = rng.randrange(1 << 31)
    if rng.random() < 0.2:
        params["presence_penalty"] = rng.uniform(-1, 1)
    max_new = rng.randint(1, max_new_tokens)
    prompt = rng.choice(PROMPTS)
    if route == "native":
        config = dict(params, max_new_tokens=max_new, num_return_sequences=1 if stream else n)
        if rng.random() < 0.2:
            config["stop_words_str"] = [rng.choice([".", "\n", " the"])]
        if rng.random() < 0.1:
            config["return_logprobs"] = True
        body = {"prompt": prompt, "generate_config": config}
        if stream:
            body["yield_generator"] = True
        return "/", body, stream
    body = dict(params, model="m", max_tokens=max_new, n=n, stream=stream)
    if rng.random() < 0.2:
        body["stop"] = [rng.choice([".", "\n"])]
    if route == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        if rng.random() < 0.2:
            body["logprobs"] = True
        return "/v1/chat/completions", body, stream
    body["prompt"] = prompt
    if rng.random() < 0.2:
        body["logprobs"] = 1
    if stream and rng.random() < 0.3:
        body["stream_options"] = {"include_usage": True}
    return "/v1/completions", body, stream


def _check(status: int, text: str, path: str, streaming: bool) -> Optional[str]:
    """Why a valid request's answer is wrong, or None."""
    if status != 200:
        return f"{status}: {text[:200]}"
    if not streaming:
        body = json.loads(text)
        return None if ("choices" in body or body.get("finished") is True) else f"incomplete: {text[:200]}"
    events = [e.partition(":")[2].strip() for e in text.split("\n\n") if e.strip()]
    if any('"error_code"' in e or e.startswith('{"error"') for e in events):
        return f"error event: {text[-300:]}"
    done = "[DONE]" if path.startswith("/v1") else "[done]"
    return None if events and events[-1] == done else f"stream without {done}: {text[-200:]}"


async def _one(session, base, rng, stats: Counter, errors: List[str], cancel_fraction: float,
               max_new_tokens: int):
    if rng.random() < 0.05:
        path, body = rng.choice(INVALID)
        async with session.post(base + path, json=body) as r:
            text = await r.text()
            kind = "invalid"
            if r.status != 400 or not json.loads(text):
                errors.append(f"invalid {path} {body} -> {r.status} {text[:200]}")
            stats[(kind, r.status)] += 1
            return
    path, body, streaming = _valid_request(rng, max_new_tokens)
    kind = ("stream " if streaming else "") + path
    if rng.random() < cancel_fraction:  # the client goes away mid-way
        try:
            async with session.post(base + path, json=body) as r:
                if streaming:
                    await r.content.readline()
                else:
                    await asyncio.wait_for(r.read(), timeout=rng.uniform(0.0, 0.3))
        except (asyncio.TimeoutError, aiohttp.ClientError):
            pass
        stats[("cancelled", kind)] += 1
        return
    async with session.post(base + path, json=body) as r:
        text = await r.text()
        problem = _check(r.status, text, path, streaming)
        stats[(kind, r.status)] += 1
        if problem:
            errors.append(f"{path} {json.dumps(body)[:200]} -> {problem}")


async def _worker_status(session, base) -> dict:
    async with session.get(base + "/worker_status") as r:
        return await r.json()


async def run(args) -> dict:
    rng = random.Random(args.seed)
    procs = _server_processes(args.base_url, args.server_pid)
    stats: Counter = Counter()
    errors: List[str] = []
    baseline: Dict[str, int] = {}
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=args.concurrency, force_close=False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        next_index = 0
        done = 0
        start = time.time()

        async def worker():
            nonlocal next_index, done, baseline
            while next_index < args.requests:
                next_index += 1
                try:
                    await _one(session, args.base_url, random.Random(rng.random()), stats, errors,
                               args.cancel_fraction, args.max_new_tokens)
                except Exception as e:  # a hang (client timeout) or a broken connection
                    errors.append(f"{type(e).__name__}: {e}")
                done += 1
                if done == max(1, args.requests // 20) and not baseline:
                    baseline = _rss(procs)
                if done % 1000 == 0:
                    print(f"  {done} requests, {time.time() - start:.0f} s, {len(errors)} errors", flush=True)

        await asyncio.gather(*[worker() for _ in range(args.concurrency)])
        duration = time.time() - start
        w = await _worker_status(session, args.base_url)
        for _ in range(100):  # cancelled streams are freed within a step
            if w["running_query_len"] + w["waiting_query_len"] == 0 and w["available_kv_cache"] == w["total_kv_cache"]:
                break
            await asyncio.sleep(0.1)
            w = await _worker_status(session, args.base_url)
    end = _rss(procs)
    base_total, end_total = sum(baseline.values()), sum(end[k] for k in baseline if k in end)
    return {"requests": done, "duration_s": round(duration, 1), "requests_per_s": round(done / duration, 1),
            "answers": {f"{k[0]} {k[1]}": n for k, n in sorted(stats.items(), key=str)},
            "unexpected": len(errors), "unexpected_examples": errors[:10],
            "rss_mb_after_warmup": {k: round(v / 2**20, 1) for k, v in baseline.items()},
            "rss_mb_end": {k: round(v / 2**20, 1) for k, v in end.items()},
            "rss_growth_pct": round(100 * (end_total - base_total) / base_total, 2) if base_total else None,
            "kv_free_at_end": f'{w["available_kv_cache"]}/{w["total_kv_cache"]} tokens',
            "streams_at_end": w["running_query_len"] + w["waiting_query_len"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base_url", default="http://127.0.0.1:8088")
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--concurrency", type=int, default=8, help="keep it under the server's --concurrency_limit")
    p.add_argument("--cancel_fraction", type=float, default=0.05)
    p.add_argument("--max_new_tokens", type=int, default=16, help="valid requests draw from [1, this]")
    p.add_argument("--request_timeout_s", type=float, default=300, help="longer counts as a hang")
    p.add_argument("--server_pid", type=int, help="the launcher's pid (default: found from the port)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save_json")
    args = p.parse_args(argv)
    report = asyncio.run(run(args))
    print(json.dumps(report, indent=2))
    if args.save_json:
        with open(args.save_json, "w") as f:
            json.dump(report, f, indent=2)
    ok = report["unexpected"] == 0 and report["streams_at_end"] == 0 and \
        report["kv_free_at_end"].split("/")[0] == report["kv_free_at_end"].split("/")[1].split()[0]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
