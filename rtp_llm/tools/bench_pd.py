"""Prefill/decode disaggregation against one PDFUSION instance, on one machine: first a PDFUSION
server, then a DECODE and a PREFILL server sharing the device (each with --kv_cache_mem_mb, the
PDFUSION one with twice that: the same KV memory in all), the same checkpoint and client.

- ttft: streamed /v1/completions of prompt_len random token ids, 2 tokens, one at a time: the
  first token's time, and the second's (under PD it comes from the decode instance, after the
  KV read: "added by the transfer" is PD's second-token time minus PDFUSION's).
- transfer: the decode instance's reads over the ttft runs (its /worker_status counters): blocks,
  bytes, GB/s of read time.
- interference: decode_streams streams of 128-token prompts and decode_len tokens, alone (idle)
  and while long_prompt-token prompts keep arriving (mixed): the streams' inter-token latency
  p50 / p99. PD's promise: mixed p99 close to idle, where PDFUSION's grows with the prompts.

One JSON line per row on stdout; the client's own CPU use is in each row (client_cpu_s).

    python -m rtp_llm.tools.bench_pd --checkpoint_path DIR [--load_format dummy] [--device cuda]
        [--kv_cache_mem_mb 16000] [--prompt_lens 1024,8192] [--long_prompt 8192]
    python -m rtp_llm.tools.bench_pd --arch qwen3-8b --tokenizer DIR --device cuda ...
(--arch: a config-only checkpoint of that architecture, random weights made at load.)"""

import argparse
import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Dict, List

import aiohttp

from rtp_llm.tools.bench_client import completions
from rtp_llm.utils.util import wait_sever_done

TOKEN_IDS = (1000, 20000)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pct(values: List[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000.0


def _prompt(rng: random.Random, n: int) -> List[int]:
    return [rng.randrange(*TOKEN_IDS) for _ in range(n)]


def _status(port: int) -> Dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/worker_status", timeout=30) as r:
        return json.loads(r.read())


def start(args, port: int, kv_mb: int, *flags: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rtp_llm.start_server", f"--checkpoint_path={args.checkpoint_path}",
           f"--start_port={port}", f"--device={args.device}", f"--act_type={args.act_type}",
           f"--load_format={args.load_format}", f"--kv_cache_mem_mb={kv_mb}", f"--max_seq_len={args.max_seq_len}",
           f"--max_batch_size={args.max_batch_size}", "--kv_transfer_host=127.0.0.1", *flags]
    cmd += [f"--model_type={args.model_type}"] if args.model_type else []
    proc = subprocess.Popen(cmd)
    if not wait_sever_done(proc, port, timeout=args.start_timeout):
        proc.kill()
        raise SystemExit(f"bench_pd: the server on port {port} was not healthy (exit code {proc.poll()})")
    return proc


def stop(procs) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()


async def ttft(url: str, args, setup: str, emit) -> None:
    rng = random.Random(7)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await completions(s, url, "bench", _prompt(rng, 64), 2, False)  # warm-up
        for n in args.prompt_lens:
            firsts, seconds, cpu = [], [], _cpu_s()
            for _ in range(args.repeats):
                r = await completions(s, url, "bench", _prompt(rng, n), 2, False)
                if not r.ok:
                    raise SystemExit(f"bench_pd: {setup} request failed: {r.error}")
                firsts.append(r.ttft)
                seconds.append(r.ttft + (r.itl[0] if r.itl else 0.0))
            emit({"setup": setup, "case": "ttft", "prompt_len": n, "repeats": args.repeats,
                  "first_token_ms_p50": _pct(firsts, 0.5), "second_token_ms_p50": _pct(seconds, 0.5),
                  "client_cpu_s": _cpu_s() - cpu})


async def interference(url: str, args, setup: str, emit) -> None:
    rng = random.Random(11)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        for mode in ("idle", "mixed"):
            done = asyncio.Event()

            async def long_prompts():
                while not done.is_set():
                    await completions(s, url, "bench", _prompt(rng, args.long_prompt), 4, False)

            cpu = _cpu_s()
            senders = [asyncio.create_task(long_prompts()) for _ in range(args.long_concurrency if mode == "mixed" else 0)]
            streams = await asyncio.gather(*[completions(s, url, "bench", _prompt(rng, 128), args.decode_len, False)
                                             for _ in range(args.decode_streams)])
            done.set()
            await asyncio.gather(*senders)
            bad = [r.error for r in streams if not r.ok]
            if bad:
                raise SystemExit(f"bench_pd: {setup} stream failed: {bad[0]}")
            itl = [x for r in streams for x in r.itl]
            emit({"setup": setup, "case": "interference", "mode": mode, "decode_streams": args.decode_streams,
                  "decode_len": args.decode_len, "long_prompt": args.long_prompt,
                  "long_concurrency": args.long_concurrency if mode == "mixed" else 0,
                  "itl_ms_p50": _pct(itl, 0.5), "itl_ms_p99": _pct(itl, 0.99), "client_cpu_s": _cpu_s() - cpu})


def run(args, emit) -> None:
    port = args.port
    fusion = start(args, port, 2 * args.kv_cache_mem_mb)
    try:
        url = f"http://127.0.0.1:{port}/v1/completions"
        asyncio.run(ttft(url, args, "pdfusion", emit))
        asyncio.run(interference(url, args, "pdfusion", emit))
    finally:
        stop([fusion])
    decode = start(args, port + 10, args.kv_cache_mem_mb, "--role_type=DECODE")
    procs = [decode]
    try:
        procs.append(start(args, port + 20, args.kv_cache_mem_mb, "--role_type=PREFILL",
                           f"--remote_rpc_server_ip=127.0.0.1:{port + 11}", *args.prefill_args.split()))
        url = f"http://127.0.0.1:{port + 20}/v1/completions"
        before = _status(port + 10)
        asyncio.run(ttft(url, args, "pd", emit))
        after = _status(port + 10)
        moved = {k: after[k] - before[k] for k in ("kv_imported_blocks", "kv_import_bytes", "kv_import_us",
                                                   "kv_imports", "kv_import_failures")}
        emit({"setup": "pd", "case": "transfer", **moved,
              "gb_s": moved["kv_import_bytes"] / max(moved["kv_import_us"], 1) / 1e3})
        asyncio.run(interference(url, args, "pd", emit))
    finally:
        stop(procs)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint_path", default="")
    p.add_argument("--arch", default="", help="random_checkpoint's architectures (instead of --checkpoint_path)")
    p.add_argument("--tokenizer", default="", help="with --arch: the tokenizer files to copy in")
    p.add_argument("--model_type", default="")
    p.add_argument("--load_format", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--act_type", default="bf16")
    p.add_argument("--kv_cache_mem_mb", type=int, default=16000, help="per PD instance (PDFUSION: twice)")
    p.add_argument("--max_seq_len", type=int, default=8448)
    p.add_argument("--max_batch_size", type=int, default=64)
    p.add_argument("--prompt_lens", default="1024,8192")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--decode_streams", type=int, default=16)
    p.add_argument("--decode_len", type=int, default=256)
    p.add_argument("--long_prompt", type=int, default=8192)
    p.add_argument("--long_concurrency", type=int, default=2)
    p.add_argument("--prefill_args", default="", help="more flags for the PREFILL instance, e.g. "
                   "'--max_num_batched_tokens=2048' (smaller prefill steps leave the shared GPU to decode sooner)")
    p.add_argument("--port", type=int, default=31000)
    p.add_argument("--start_timeout", type=int, default=600)
    args = p.parse_args(argv)
    args.prompt_lens = [int(x) for x in args.prompt_lens.split(",")]
    if args.arch:
        from rtp_llm.tools.random_checkpoint import write_config

        args.checkpoint_path = write_config(args.arch, os.path.join(tempfile.gettempdir(), f"rtp_llm_pd_{args.arch}"),
                                            args.tokenizer or None)
        args.load_format, args.model_type = "dummy", args.model_type or "qwen_3"
    elif not args.checkpoint_path:
        p.error("--checkpoint_path or --arch is required")
    return args


def main(argv=None) -> None:
    args = parse(argv)
    run(args, lambda row: print(json.dumps(row), flush=True))


if __name__ == "__main__":
    main()
