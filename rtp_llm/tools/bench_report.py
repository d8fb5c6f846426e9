"""bench_serve's report: the client processes' results merged into throughput, latency
percentiles (TTFT, TPOT, ITL, end to end), the client's own CPU use and the server's samples;
printed, saved as JSON, optionally plotted."""

import math
import statistics
from dataclasses import asdict
from typing import List

from rtp_llm.tools.bench_client import ShardReport

# A client process above this fraction of one core may itself be what limits the run.
CLIENT_CORE_WARN = 0.8


def percentiles(values: List[float], scale: float = 1000.0) -> dict:
    """mean, p50 (the median), p90, p99 of `values` x scale (linear interpolation, as numpy)."""
    if not values:
        return {}
    v = sorted(values)

    def pick(p: float) -> float:
        k = p * (len(v) - 1)
        lo, hi = math.floor(k), math.ceil(k)
        return v[lo] + (v[hi] - v[lo]) * (k - lo)

    return {"mean": statistics.fmean(v) * scale, "p50": pick(0.5) * scale, "p90": pick(0.9) * scale,
            "p99": pick(0.99) * scale}


def client_cpu(shards: List[ShardReport], duration: float) -> dict:
    per_proc = [s.cpu_s / max(s.end - s.start, 1e-9) for s in shards]
    return {"processes": len(shards), "cpu_s": sum(s.cpu_s for s in shards),
            "cores_used": sum(s.cpu_s for s in shards) / duration, "max_process_core_fraction": max(per_proc),
            "saturated": max(per_proc) > CLIENT_CORE_WARN}


def build(args, shards: List[ShardReport], server: dict) -> dict:
    results = [r for s in shards for r in s.results]
    ok = [r for r in results if r.ok]
    duration = max(s.end for s in shards) - min(s.start for s in shards)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    streamed = args.endpoint != "native"
    # TPOT as vLLM's: a request's time after its first chunk over its other tokens.
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1 and streamed]
    chunks = sum(r.chunks for r in ok)
    report = {
        "endpoint": args.endpoint, "model": args.model, "num_prompts": args.num_prompts,
        "concurrency": args.concurrency, "client_procs": len(shards), "request_rate": args.request_rate,
        "input_len": args.input_len, "output_len": args.output_len,
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "output_tokens": out_tokens, "prompt_tokens": in_tokens,
        "request_throughput": len(ok) / duration, "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "ttft_ms": percentiles([r.ttft for r in ok]), "tpot_ms": percentiles(tpot),
        "itl_ms": percentiles([x for r in ok for x in r.itl]),
        "tokens_per_chunk": out_tokens / chunks if chunks else None,
        "e2e_ms": percentiles([r.e2e for r in ok]),
        "client_cpu": client_cpu(shards, duration), "server": server,
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }
    overhead = [r.e2e - r.engine_time for r in ok if r.engine_time is not None]
    if overhead:
        report["server_overhead_ms"] = percentiles(overhead)
    # Per request, for --plot (the ITL lists are left out: a long run has millions).
    report["_latencies"] = [{k: v for k, v in asdict(r).items() if k != "itl"} for r in ok]
    return report


def show(report: dict) -> None:
    r = report
    print(f"endpoint {r['endpoint']}  prompts {r['num_prompts']}  concurrency {r['concurrency']} "
          f"over {r['client_procs']} client processes  rate {r['request_rate'] or 'inf'}  "
          f"in {r['input_len']}  out {r['output_len']}")
    print(f"successful {r['completed']}  failed {r['failed']}  duration {r['duration_s']:.2f} s  "
          f"output tokens {r['output_tokens']}")
    print(f"throughput: {r['request_throughput']:.2f} req/s  {r['output_token_throughput']:.1f} output tok/s  "
          f"{r['total_token_throughput']:.1f} total tok/s")
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "server_overhead_ms"):
        p = r.get(key)
        if p:
            print(f"{key:>19}: " + "  ".join(f"{k} {v:8.2f}" for k, v in p.items()))
    if r["tokens_per_chunk"]:
        print(f"{'tokens per chunk':>19}: {r['tokens_per_chunk']:.2f}")
    c = r["client_cpu"]
    print(f"client CPU: {c['cores_used']:.2f} cores over {c['processes']} processes, "
          f"busiest process {c['max_process_core_fraction']:.0%} of a core")
    if c["saturated"]:
        print(f"WARNING: a client process used {c['max_process_core_fraction']:.0%} of a core (> "
              f"{CLIENT_CORE_WARN:.0%}): the client may be the bottleneck; raise --client_procs")
    s = r["server"]
    if s["available"]:
        print(f"server (/worker_status, {s['samples']} samples): running streams median "
              f"{s['running_streams_median']:g} (max {s['running_streams_max']}), waiting median "
              f"{s['waiting_streams_median']:g}; engine generated {s['generated_tokens_delta']} tokens, "
              f"{s['engine_output_tok_s']:.1f} tok/s over {s['window_s']:.2f} s")
    else:
        print(f"server sampling unavailable: {s['reason']}")
    for e in r["errors"]:
        print("error:", e)


def plot(report: dict, path: str) -> None:
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
    fig.suptitle(f"{report['endpoint']} c={report['concurrency']}: "
                 f"{report['output_token_throughput']:.0f} output tok/s")
    fig.tight_layout()
    fig.savefig(path)
