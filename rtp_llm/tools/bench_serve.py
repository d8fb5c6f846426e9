"""Load generator for a running server (in the spirit of `vllm bench serve`): prints
throughput and TTFT / TPOT / ITL / end-to-end latency percentiles, optionally saves a JSON
report and a PNG plot. On the native endpoint it also reports the server's overhead per
request: client-measured latency minus the engine's own aux_info.cost_time (HTTP, tokenize,
gRPC, detokenize).

    python -m rtp_llm.tools.bench_serve --base_url http://127.0.0.1:30000 --num_prompts 64 \\
        --input_len 128 --output_len 64 --concurrency 16 [--request_rate 4] \\
        [--endpoint completions|chat|native] [--save_json r.json] [--plot r.png]
"""

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import List, Optional

import aiohttp


@dataclass
class Result:
    ok: bool
    e2e: float = 0.0
    ttft: float = 0.0
    itl: List[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    engine_time: Optional[float] = None  # native: aux_info.cost_time (s)
    error: str = ""


def _percentiles(values: List[float]) -> dict:
    if not values:
        return {}
    v = sorted(values)
    pick = lambda p: v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))]  # noqa: E731
    return {"mean": statistics.fmean(v), "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99)}


async def _completions(session, url, prompt_ids, output_len, chat: bool) -> Result:
    body = {"model": "bench", "max_tokens": output_len, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": " ".join(str(t) for t in prompt_ids)}]
    else:
        body["prompt"] = prompt_ids
    start = time.perf_counter()
    last, r = start, Result(ok=False)
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            return Result(ok=False, error=f"{resp.status}: {(await resp.text())[:200]}")
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            now = time.perf_counter()
            if chunk.get("usage"):
                r.output_tokens = chunk["usage"]["completion_tokens"]
                r.prompt_tokens = chunk["usage"]["prompt_tokens"]
            if chunk.get("choices") and (chunk["choices"][0].get("text") or chunk["choices"][0].get("delta", {}).get("content")):
                if r.ttft == 0.0:
                    r.ttft = now - start
                else:
                    r.itl.append(now - last)
                last = now
    r.e2e = time.perf_counter() - start
    r.ok = True
    return r


async def _native(session, url, prompt_ids, output_len) -> Result:
    body = {"prompt": prompt_ids, "generate_config": {"max_new_tokens": output_len, "temperature": 0,
                                                       "ignore_eos": True}}
    start = time.perf_counter()
    async with session.post(url, json=body) as resp:
        text = await resp.text()
        if resp.status != 200:
            return Result(ok=False, error=f"{resp.status}: {text[:200]}")
    e2e = time.perf_counter() - start
    aux = json.loads(text)["aux_info"]
    return Result(ok=True, e2e=e2e, ttft=aux["first_token_cost_time"] / 1000.0, output_tokens=aux["output_len"],
                  prompt_tokens=aux["input_len"], engine_time=aux["cost_time"] / 1000.0)


async def run(args) -> dict:
    rng = random.Random(args.seed)

    def length(base: int) -> int:
        return max(1, int(base * rng.uniform(1 - args.range_ratio, 1 + args.range_ratio)))

    requests = [([rng.randrange(1000, 20000) for _ in range(length(args.input_len))], length(args.output_len))
                for _ in range(args.num_prompts)]
    path = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "native": "/"}[args.endpoint]
    url = args.base_url.rstrip("/") + path
    limit = asyncio.Semaphore(args.concurrency)
    results: List[Result] = []

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=args.timeout)) as session:
        async def one(prompt, out_len):
            async with limit:
                try:
                    if args.endpoint == "native":
                        results.append(await _native(session, url, prompt, out_len))
                    else:
                        results.append(await _completions(session, url, prompt, out_len, args.endpoint == "chat"))
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    results.append(Result(ok=False, error=repr(e)))

        start = time.perf_counter()
        tasks = []
        for prompt, out_len in requests:
            tasks.append(asyncio.create_task(one(prompt, out_len)))
            if args.request_rate > 0:
                await asyncio.sleep(rng.expovariate(args.request_rate))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - start

    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1 and args.endpoint != "native"]
    report = {
        "endpoint": args.endpoint, "num_prompts": args.num_prompts, "concurrency": args.concurrency,
        "request_rate": args.request_rate, "input_len": args.input_len, "output_len": args.output_len,
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "request_throughput": len(ok) / duration, "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "ttft_ms": {k: v * 1000 for k, v in _percentiles([r.ttft for r in ok]).items()},
        "tpot_ms": {k: v * 1000 for k, v in _percentiles(tpot).items()},
        "itl_ms": {k: v * 1000 for k, v in _percentiles([x for r in ok for x in r.itl]).items()},
        "e2e_ms": {k: v * 1000 for k, v in _percentiles([r.e2e for r in ok]).items()},
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }
    overhead = [r.e2e - r.engine_time for r in ok if r.engine_time is not None]
    if overhead:
        report["server_overhead_ms"] = {k: v * 1000 for k, v in _percentiles(overhead).items()}
    report["_latencies"] = [asdict(r) for r in ok]
    return report


def _print(report: dict) -> None:
    print(f"endpoint {report['endpoint']}  prompts {report['num_prompts']}  concurrency {report['concurrency']}  "
          f"rate {report['request_rate'] or 'inf'}  in {report['input_len']}  out {report['output_len']}")
    print(f"completed {report['completed']}  failed {report['failed']}  duration {report['duration_s']:.2f} s")
    print(f"throughput: {report['request_throughput']:.2f} req/s  {report['output_token_throughput']:.1f} output tok/s"
          f"  {report['total_token_throughput']:.1f} total tok/s")
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "server_overhead_ms"):
        p = report.get(key)
        if p:
            print(f"{key:>19}: " + "  ".join(f"{k} {v:8.1f}" for k, v in p.items()))
    for e in report["errors"]:
        print("error:", e)


def _plot(report: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib")
    lat = report["_latencies"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].hist([r["ttft"] * 1000 for r in lat], bins=30)
    axes[0].set_xlabel("TTFT (ms)")
    axes[1].hist([r["e2e"] * 1000 for r in lat], bins=30)
    axes[1].set_xlabel("end-to-end latency (ms)")
    fig.suptitle(f"{report['endpoint']} c={report['concurrency']}: {report['output_token_throughput']:.0f} output tok/s")
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base_url", default="http://127.0.0.1:8088")
    p.add_argument("--endpoint", choices=["completions", "chat", "native"], default="completions")
    p.add_argument("--num_prompts", type=int, default=64)
    p.add_argument("--input_len", type=int, default=128)
    p.add_argument("--output_len", type=int, default=64)
    p.add_argument("--range_ratio", type=float, default=0.0, help="lengths vary uniformly by +-this fraction")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--request_rate", type=float, default=0.0, help="Poisson arrivals per second (0: all at once)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save_json")
    p.add_argument("--plot")
    args = p.parse_args(argv)
    report = asyncio.run(run(args))
    _print(report)
    if args.save_json:
        with open(args.save_json, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot:
        _plot(report, args.plot)


if __name__ == "__main__":
    main()
