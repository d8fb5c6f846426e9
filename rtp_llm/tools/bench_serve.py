"""Load generator for a running server, in the spirit of `vllm bench serve --dataset-name
random`: random prompts of exactly --input_len token ids, --output_len new tokens each
(ignore_eos), streaming /v1/completions (or chat, or our native API). Several client
processes (--client_procs), each with its own event loop and an uncapped connection pool,
share the concurrency and the prompts and start together; the report merges them: requests,
throughput, TTFT / TPOT / ITL / end-to-end percentiles, the client's own CPU use, and the
server's /worker_status sampled through the run (running streams, the engine's own tokens/s).
On the native endpoint it also reports the server's overhead per request: client latency
minus the engine's aux_info.cost_time.

    python -m rtp_llm.tools.bench_serve --base_url http://127.0.0.1:30000 --num_prompts 1024 \\
        --input_len 128 --output_len 1024 --concurrency 256 [--client_procs 4] [--model NAME] \\
        [--request_rate 4] [--endpoint completions|chat|native] [--json_out r.json] [--plot r.png] \\
        [--json_schema long|FILE]
"""

import argparse
import json
import math
import multiprocessing
import os
import queue
import random
import sys
import time
import urllib.request
from typing import List, Optional

from rtp_llm.tools import bench_report
from rtp_llm.tools.bench_client import BARRIER_TIMEOUT_S, PATHS, Shard, ShardReport, client_main
from rtp_llm.tools.bench_sampler import ServerSampler

# Streams one client process drives at most by default (one event loop parses every chunk).
STREAMS_PER_PROC = 64
# Random prompt token ids are drawn from this range (inside any real model's vocabulary,
# clear of the special tokens at its ends).
TOKEN_IDS = (1000, 20000)


def default_client_procs(concurrency: int) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(math.ceil(concurrency / STREAMS_PER_PROC), cpus))


def workload(args) -> list:
    """(prompt token ids, output length) per request, from --seed."""
    rng = random.Random(args.seed)

    def length(base: int) -> int:
        return max(1, int(base * rng.uniform(1 - args.range_ratio, 1 + args.range_ratio)))

    return [([rng.randrange(*TOKEN_IDS) for _ in range(length(args.input_len))], length(args.output_len))
            for _ in range(args.num_prompts)]


def served_model(base_url: str) -> str:
    """The first model /v1/models lists (vLLM's --served-model-name), or "bench" without one."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/v1/models", timeout=10) as r:
            return json.loads(r.read())["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError):
        return "bench"


# --json_schema long: an array of short strings that stays open for any --output_len (so every
# token is sampled under the grammar; ignore_eos lets nothing end it early).
LONG_SCHEMA = {"type": "array", "items": {"type": "string", "pattern": "^[a-z ]{1,24}$"}, "minItems": 100000}


def json_schema(args) -> Optional[dict]:
    if not args.json_schema:
        return None
    if args.json_schema == "long":
        return LONG_SCHEMA
    with open(args.json_schema) as f:
        return json.load(f)


def shards(args, requests: list, procs: int) -> List[Shard]:
    """Process i gets requests i, i + procs, ... and its share of the concurrency and rate."""
    out, schema = [], json_schema(args)
    for i in range(procs):
        mine = requests[i::procs]
        out.append(Shard(base_url=args.base_url, endpoint=args.endpoint, model=args.model, requests=mine,
                         concurrency=args.concurrency // procs + (i < args.concurrency % procs),
                         request_rate=args.request_rate * len(mine) / len(requests), timeout=args.timeout,
                         seed=args.seed * 1000 + i, json_schema=schema))
    return out


def _check_alive(procs) -> None:
    dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
    if dead:
        raise SystemExit(f"bench_serve: a client process exited with {dead[0]} (its traceback is above)")


def _wait_at_barrier(procs, barrier) -> None:
    """Until every client process waits at the barrier (started, connected pool made)."""
    deadline = time.time() + BARRIER_TIMEOUT_S
    while barrier.n_waiting < len(procs):
        _check_alive(procs)
        if time.time() > deadline:
            raise SystemExit(f"bench_serve: the client processes were not all up within {BARRIER_TIMEOUT_S} s")
        time.sleep(0.02)


def run(args) -> dict:
    """Runs the load over args.client_procs processes and returns the merged report."""
    requests = workload(args)
    procs_n = max(1, min(args.client_procs or default_client_procs(args.concurrency), args.concurrency,
                         args.num_prompts))
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no inherited loop or threads
    barrier, out = ctx.Barrier(procs_n + 1), ctx.Queue()
    procs = [ctx.Process(target=client_main, args=(shard, barrier, out), daemon=True, name=f"bench client {i}")
             for i, shard in enumerate(shards(args, requests, procs_n))]
    for p in procs:
        p.start()
    sampler = ServerSampler(args.base_url)
    reports: List[ShardReport] = []
    try:
        _wait_at_barrier(procs, barrier)
        sampler.start()  # its first sample precedes every request
        barrier.wait(BARRIER_TIMEOUT_S)
        while len(reports) < procs_n:
            try:
                reports.append(out.get(timeout=1))
            except queue.Empty:
                _check_alive(procs)
    finally:
        sampler.stop()  # its last sample follows every response
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
    return bench_report.build(args, reports, sampler.summary())


def parse(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base_url", default="http://127.0.0.1:8088")
    p.add_argument("--endpoint", choices=sorted(PATHS), default="completions")
    p.add_argument("--model", help="the request's model name (default: the first of the server's /v1/models)")
    p.add_argument("--num_prompts", type=int, default=64)
    p.add_argument("--input_len", type=int, default=128, help="prompt tokens (random token ids)")
    p.add_argument("--output_len", type=int, default=64, help="new tokens per request (ignore_eos)")
    p.add_argument("--range_ratio", type=float, default=0.0, help="lengths vary uniformly by +-this fraction")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight at most, over all processes")
    p.add_argument("--client_procs", type=int, default=0,
                   help=f"client processes (0: ceil(concurrency / {STREAMS_PER_PROC}), at most the CPUs)")
    p.add_argument("--request_rate", type=float, default=0.0, help="Poisson arrivals per second (0: all at once)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json_schema", help="structured output: every request's output follows this JSON Schema (a "
                                         "file; 'long': an array of strings that never closes), sent as vLLM's "
                                         "structured_outputs.json (native: generate_config.json_schema)")
    p.add_argument("--json_out", "--save_json", dest="json_out", help="write the report as JSON here")
    p.add_argument("--plot", help="write TTFT and latency histograms (PNG) here")
    args = p.parse_args(argv)
    for name in ("num_prompts", "input_len", "output_len", "concurrency"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.client_procs < 0:
        p.error(f"--client_procs must be >= 0, got {args.client_procs}")
    args.model = args.model or served_model(args.base_url)
    return args


def main(argv: Optional[list] = None) -> dict:
    args = parse(argv)
    report = run(args)
    bench_report.show(report)
    sys.stdout.flush()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot:
        bench_report.plot(report, args.plot)
    return report


if __name__ == "__main__":
    main()
