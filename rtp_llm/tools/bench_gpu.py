"""The GPU benchmark suite, with the peers measured in the same run on the same GPU:

- the memory-bandwidth floor: weight bytes / measured device copy bandwidth;
- offline (the LLM API) and through the HTTP server (OpenAI completions, streaming):
  batch-1 TTFT and TPOT for a 128- and a 1024-token prompt, and throughput (total and output
  tokens/s) for 1024 in / 128 out and 128 in / 1024 out at concurrency 1, 16, 64, 256;
- HF transformers generate() through ../shared/bench/hf_baseline.py (--hf_baseline PATH).

Random bf16 weights of the named architecture (speed does not depend on the values; every
request generates exactly its length with ignore_eos). Prints one JSON line per measurement
(and appends them to --out), then a summary table.

    python -m rtp_llm.tools.bench_gpu --arch qwen3-0.6b [--tokenizer DIR] [--hf_baseline PATH] \\
        [--out results.jsonl] [--skip server,offline,hf]
    python -m rtp_llm.tools.bench_gpu --plot results.jsonl --plot_out bench.png
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

import torch

from rtp_llm.utils.util import wait_sever_done

SHAPES = [(1024, 128), (128, 1024)]
CONCURRENCY = [1, 16, 64, 256]
LATENCY_PROMPTS = [128, 1024]


def emit(out, record: dict):
    line = json.dumps(record)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def copy_bandwidth() -> float:
    """The device's copy bandwidth in bytes/s (a copy reads and writes every byte)."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        b.copy_(a)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 20
    del a, b
    torch.cuda.empty_cache()
    return 2 * n / seconds


def bandwidth_floor(ckpt: str) -> dict:
    weights = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    bw = copy_bandwidth()
    return {"weights_bytes": weights, "copy_bandwidth_GBps": bw / 1e9, "tpot_floor_ms": weights / bw * 1e3}


def random_prompts(vocab: int, batch: int, length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(min(1000, vocab // 2), min(vocab, 150000) - 100, (batch, length), generator=g).tolist()


def offline(ckpt: str, emit_, overlap: bool = True, throughput: bool = True, max_batch_size: int = 256,
            load_format: str = "auto", concurrency=None, quantization: Optional[str] = None,
            kv_cache_dtype: str = "auto"):
    """Our engine through the LLM API (load_format "dummy": random weights from config.json;
    quantization, kv_cache_dtype: the flags' values)."""
    from rtp_llm.llm import LLM

    llm = LLM(ckpt, act_type="bf16", progress=False, device="cuda", max_seq_len=2176, max_batch_size=max_batch_size,
              max_num_batched_tokens=8192, overlap_schedule=None if overlap else False, load_format=load_format,
              quantization=quantization, kv_cache_dtype=kv_cache_dtype)

    def gen(prompts, n):
        t = time.perf_counter()
        outs = llm.generate(prompts, {"max_new_tokens": n, "temperature": 0, "ignore_eos": True})
        assert all(len(o.outputs[0].token_ids) == n for o in outs)
        return time.perf_counter() - t

    measure_offline(gen, llm.loaded.config.vocab_size, emit_, throughput, llm.engine.core.stats, concurrency)
    llm.close()


def _refill_like_ours(worker) -> int:
    """Runs in each vLLM worker (LLM.collective_rpc): its model's weights refilled in place with
    our --load_format=dummy distribution (model_loader.dummy.dummy_value; vLLM's dummy values are
    +-1e-3 with one seed for every tensor). Weights derived at load (e.g. MLA's absorbed
    up-projections) keep vLLM's values: their speed does not depend on them. -> tensors refilled."""
    from rtp_llm.model_loader.dummy import dummy_value

    model = worker.get_model()
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(0)
    n = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.is_floating_point() and param.dtype.itemsize >= 2:  # (not FP8 weights)
                param.copy_(dummy_value(name, param.shape, param.dtype, gen))
                n += 1
    return n


def vllm_offline(ckpt: str, emit_, max_batch_size: int = 256, concurrency=None, load_format: str = "dummy",
                 kv_cache_dtype: str = "auto", ours_dummy_values: bool = False):
    """vLLM's LLM API with our offline rows' limits and prompts, random weights (its
    load_format="dummy"; "auto": the checkpoint's, e.g. a quantized one), token ids in and out
    (no tokenizer needed). ours_dummy_values: dummy weights refilled with our distribution
    (_refill_like_ours): a MoE router over vLLM's near-zero values ties, so every token picks the
    same experts and a decode step reads a fraction of the weights ours reads."""
    if ours_dummy_values:  # the refill is a callable sent to vLLM's engine process
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=ckpt, dtype="bfloat16", max_model_len=2176, max_num_seqs=max_batch_size,
              max_num_batched_tokens=8192, gpu_memory_utilization=0.85, seed=0, load_format=load_format,
              skip_tokenizer_init=True, kv_cache_dtype=kv_cache_dtype)
    refilled = llm.collective_rpc(_refill_like_ours) if ours_dummy_values else None
    emit_({"mode": "startup", "seconds": time.perf_counter() - t0, "refilled_tensors": refilled})

    def gen(prompts, n):
        sp = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, detokenize=False)
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == n for o in outs)
        return time.perf_counter() - t

    with open(os.path.join(ckpt, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    measure_offline(gen, vocab, emit_, True, concurrency=concurrency)


def measure_offline(gen, vocab: int, emit_, throughput: bool = True, stats=None, concurrency=None):
    """The offline rows through gen(prompts, n) -> seconds (an engine's greedy, ignore_eos
    generation of n tokens for each token-id prompt): batch-1 TTFT and TPOT, then throughput.
    stats: our engine's core stats (a throughput row then says its steps and preemptions, and
    the KV cache's size)."""
    gen(random_prompts(vocab, 4, 64, 0), 8)  # warm-up
    # ... and a step longer than the CUDA graphs hold, beside a decode row: kernels that only
    # eager steps run (e.g. MLA's expanded form) compile here, not in the first timed row.
    gen(random_prompts(vocab, 1, 64, 1) + random_prompts(vocab, 12, 1024, 2), 2)
    for p in LATENCY_PROMPTS:
        # A new prompt for every run: a repeated one would be served from the prefix cache.
        fresh = iter(random_prompts(vocab, 9, p, p))
        gen([next(fresh)], 4)
        ttft = statistics.median(gen([next(fresh)], 1) for _ in range(5))
        full = statistics.median(gen([next(fresh)], 128) for _ in range(3))
        emit_({"mode": "offline", "case": "latency", "prompt_len": p, "ttft_ms": ttft * 1e3,
               "tpot_ms": (full - ttft) / 127 * 1e3})
    for inp, outp in SHAPES if throughput else []:
        for c in concurrency or CONCURRENCY:
            before = stats() if stats else {}
            seconds = gen(random_prompts(vocab, c, inp, c), outp)
            extra = {}
            if stats:
                after = stats()
                extra = {"steps": after["steps"] - before["steps"],
                         "preemptions": after["preemptions"] - before["preemptions"],
                         "kv_tokens": after["total_blocks"] * after["block_size"]}
            emit_({"mode": "offline", "case": "throughput", "input_len": inp, "output_len": outp, "concurrency": c,
                   "output_tok_s": c * outp / seconds, "total_tok_s": c * (inp + outp) / seconds, **extra})


def serve_load(url: str, inp: int, outp: int, c: int, n: int) -> dict:
    """One bench_serve run against `url`, in its own processes (the load client must not share
    this process or its CPU): its JSON report."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "report.json")
        subprocess.run([sys.executable, "-m", "rtp_llm.tools.bench_serve", f"--base_url={url}",
                        "--endpoint=completions", f"--num_prompts={n}", f"--input_len={inp}", f"--output_len={outp}",
                        f"--concurrency={c}", f"--seed={c}", f"--json_out={path}"], check=True)
        with open(path) as f:
            r = json.load(f)
    if r["failed"]:
        raise RuntimeError(f"{r['failed']} requests failed: {r['errors']}")
    return r


def server(ckpt: str, port: int, emit_, overlap: bool = True, throughput: bool = True, frontends: int = 0,
           max_batch_size: int = 256):
    """frontends 0: the server's default count (sized from the cores)."""
    cmd = [sys.executable, "-m", "rtp_llm.start_server", f"--checkpoint_path={ckpt}", "--model_type=qwen_3",
           f"--start_port={port}", "--device=cuda", f"--max_batch_size={max_batch_size}", "--max_seq_len=2176",
           "--max_num_batched_tokens=8192", f"--overlap_schedule={int(overlap)}"]
    cmd += [f"--frontend_server_count={frontends}"] if frontends else []
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_sever_done(proc, port, timeout=600):
            raise RuntimeError(f"the server was not healthy within 600 s (exit code {proc.poll()})")
        serve_load(url, 64, 8, 4, 8)  # warm-up
        for p in LATENCY_PROMPTS:
            r = serve_load(url, p, 128, 1, 5)
            emit_({"mode": "server", "case": "latency", "prompt_len": p, "ttft_ms": r["ttft_ms"]["p50"],
                   "tpot_ms": r["tpot_ms"]["p50"]})
        for inp, outp in SHAPES if throughput else []:
            for c in CONCURRENCY:
                r = serve_load(url, inp, outp, c, max(c, 4) if outp <= 128 else max(c, 2))
                s = r["server"]
                emit_({"mode": "server", "case": "throughput", "input_len": inp, "output_len": outp,
                       "concurrency": c, "frontends": frontends or "default", "output_tok_s": r["output_token_throughput"],
                       "total_tok_s": r["total_token_throughput"], "ttft_p50_ms": r["ttft_ms"]["p50"],
                       "tpot_p50_ms": r["tpot_ms"].get("p50"), "itl_p50_ms": r["itl_ms"].get("p50"),
                       "itl_p99_ms": r["itl_ms"].get("p99"), "tokens_per_chunk": r["tokens_per_chunk"],
                       "engine_output_tok_s": s.get("engine_output_tok_s"),
                       "running_streams_median": s.get("running_streams_median"),
                       "client_procs": r["client_procs"], "client_cores": r["client_cpu"]["cores_used"],
                       "client_max_core_fraction": r["client_cpu"]["max_process_core_fraction"]})
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def hf(path: str, arch: str, emit_, compile_: bool, batches: str, timeout: int):
    cmd = [sys.executable, path, "--arch", arch, "--device", "cuda", "--prompt-len", "128", "--gen-len", "128",
           "--batches", batches] + ([] if compile_ else ["--no-compile"])
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        lines = res.stdout.splitlines()
    except subprocess.TimeoutExpired as e:
        lines = (e.stdout or b"").decode().splitlines() if isinstance(e.stdout, bytes) else (e.stdout or "").splitlines()
        emit_({"mode": "hf", "note": f"timed out after {timeout} s; partial results"})
    for line in lines:
        if line.startswith("{"):
            emit_(dict(json.loads(line), mode="hf"))


def plot(results: str, out: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(results) if line.strip()]
    archs = sorted({r["arch"] for r in rows if "arch" in r and r.get("mode") in ("offline", "server")})
    fig, axes = plt.subplots(1, len(SHAPES), figsize=(6 * len(SHAPES), 4), squeeze=False)
    for ax, (inp, outp) in zip(axes[0], SHAPES):
        for arch in archs:
            for mode, style in (("offline", "-o"), ("server", "--s")):
                pts = sorted((r["concurrency"], r["total_tok_s"]) for r in rows
                             if r.get("arch") == arch and r.get("mode") == mode and r.get("case") == "throughput"
                             and r["input_len"] == inp and r["output_len"] == outp)
                if pts:
                    ax.plot(*zip(*pts), style, label=f"{arch} {mode}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrency")
        ax.set_ylabel("total tokens/s")
        ax.set_title(f"{inp} in / {outp} out")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="qwen3-0.6b", help="the random checkpoint's architecture; the rows' label (say "
                   "which --checkpoint is)")
    p.add_argument("--checkpoint", help="default: a random one written to /tmp/rtp_llm_bench_<arch>")
    p.add_argument("--tokenizer", help="tokenizer files for the random checkpoint (the server detokenizes)")
    p.add_argument("--hf_baseline", help="path of hf_baseline.py (the HF transformers peer)")
    p.add_argument("--hf_compile", action="store_true", help="also HF's static cache + torch.compile path")
    p.add_argument("--hf_batches", default="1,16,64,256")
    p.add_argument("--hf_timeout", type=int, default=600, help="seconds for the HF peer (partial results past it)")
    p.add_argument("--skip", default="", help="comma list of: offline, server, hf, throughput")
    p.add_argument("--no_overlap", action="store_true", help="our engine steps in turn (no overlapped scheduling)")
    p.add_argument("--shapes", default=",".join(f"{i}x{o}" for i, o in SHAPES), help="throughput in x out lengths")
    p.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    p.add_argument("--max_batch_size", type=int, default=256,
                   help="streams per step, offline and in the server (at least the largest --concurrency to run it all at once)")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--frontends", type=int, default=0, help="our server's --frontend_server_count (0: its default)")
    p.add_argument("--out")
    p.add_argument("--plot", help="a results.jsonl to plot instead of running")
    p.add_argument("--plot_out", default="bench_gpu.png")
    a = p.parse_args()
    if a.plot:
        plot(a.plot, a.plot_out)
        return
    from rtp_llm.tools.random_checkpoint import write

    skip = set(filter(None, a.skip.split(",")))
    SHAPES[:] = [tuple(int(n) for n in shape.split("x")) for shape in a.shapes.split(",")]
    CONCURRENCY[:] = [int(c) for c in a.concurrency.split(",")]
    ckpt = a.checkpoint or write(a.arch, f"/tmp/rtp_llm_bench_{a.arch}", a.tokenizer)
    base = {"arch": a.arch, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "overlap": not a.no_overlap}
    emit_ = lambda r: emit(a.out, dict(base, **r))  # noqa: E731
    emit_(dict(mode="floor", **bandwidth_floor(ckpt)))
    if "offline" not in skip:
        offline(ckpt, emit_, not a.no_overlap, "throughput" not in skip, a.max_batch_size)
    if "server" not in skip:
        server(ckpt, a.port, emit_, not a.no_overlap, "throughput" not in skip, a.frontends, a.max_batch_size)
    if "hf" not in skip and a.hf_baseline:
        hf(a.hf_baseline, a.arch, emit_, a.hf_compile, a.hf_batches, a.hf_timeout)


if __name__ == "__main__":
    main()
