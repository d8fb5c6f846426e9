"""Quantized checkpoints on the GPU, ours and vLLM's engine on the same files (issue 23): random
bf16 weights of a named architecture (random_checkpoint), quantized by our own tool
(rtp_llm.tools.quantize), each engine offline on each: batch-1 TTFT / TPOT and throughput (bench_gpu's
offline rows), with the weight-read floor of each checkpoint.

    python -m rtp_llm.tools.bench_quant --arch qwen3-8b --quant bf16,fp8 --engine ours|vllm \\
        [--kv_cache_dtype fp8] [--concurrency 256] [--out results.jsonl]

--quant fp8 is block FP8 (Qwen3-FP8's format): our engine widens it to bf16 unless
RTP_LLM_CUDA_FP8_BLOCK=1 (each row says which); fp8_channel runs on the FP8 kernels; gptq is
4-bit GPTQ in groups of 128 (vLLM runs it with its Marlin kernels); int8 is the bf16 checkpoint
with our --quantization=int8 (per-row int8 made at load; ours only).

One engine per process (run it once per engine: both hold most of the GPU's memory), and for
vLLM one --quant (its memory is freed at exit only). The checkpoints are written once to
/tmp/rtp_llm_bench_<arch>[_<quant>] and reused."""

import argparse
import os
import tempfile

import torch

from rtp_llm.tools.bench_gpu import CONCURRENCY, SHAPES, copy_bandwidth, emit, offline, vllm_offline

# --quant -> the rtp_llm.tools.quantize scheme writing it (bf16: the random checkpoint as written)
SCHEMES = {"bf16": None, "fp8": "block", "fp8_channel": "channel", "gptq": "gptq", "int8": None}
AT_LOAD = {"int8": "int8"}  # --quant -> our --quantization on the bf16 checkpoint (ours only)


def checkpoint(arch: str, quant: str) -> str:
    from rtp_llm.tools.quantize import write as quantize
    from rtp_llm.tools.random_checkpoint import write

    root = os.path.join(tempfile.gettempdir(), f"rtp_llm_bench_{arch}")
    src = write(arch, root)
    if SCHEMES[quant] is None:
        return src
    out = f"{root}_{quant}"
    return out if os.path.exists(os.path.join(out, "config.json")) else quantize(src, out, SCHEMES[quant])


def read_floor_bytes(ckpt: str, int8_projections: bool = False) -> int:
    """Bytes a decoded token reads: every stored tensor but the embedding table (one row; a tied
    one is read again as the LM head); int8_projections: the decoder's projections as --quantization
    int8 makes them on CUDA (a byte a weight, an fp32 scale a row)."""
    import json

    from safetensors import safe_open

    with open(os.path.join(ckpt, "config.json")) as f:
        tied = json.load(f).get("tie_word_embeddings", False)
    total = 0
    for name in (x for x in os.listdir(ckpt) if x.endswith(".safetensors")):
        with safe_open(os.path.join(ckpt, name), "pt") as st:
            for key in st.keys():
                t = st.get_slice(key)
                n = 1
                for d in t.get_shape():
                    n *= d
                nbytes = n * {"F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4, "I32": 4}[t.get_dtype()]
                if int8_projections and key.startswith("model.layers.") and key.endswith("_proj.weight"):
                    nbytes = n + 4 * t.get_shape()[0]
                if key != "model.embed_tokens.weight" or tied:
                    total += nbytes
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="qwen3-8b")
    p.add_argument("--quant", default="bf16,fp8", help=f"comma list of {', '.join(SCHEMES)}")
    p.add_argument("--engine", default="ours", choices=["ours", "vllm"])
    p.add_argument("--shapes", default=",".join(f"{i}x{o}" for i, o in SHAPES), help="throughput in x out lengths")
    p.add_argument("--concurrency", default="256", help="the throughput rows' concurrencies")
    p.add_argument("--kv_cache_dtype", default="auto", choices=["auto", "fp8"],
                   help="both engines' --kv_cache_dtype (fp8: e4m3 K/V, scale 1)")
    p.add_argument("--max_batch_size", type=int, default=256)
    p.add_argument("--out")
    a = p.parse_args()
    quants = a.quant.split(",")
    if a.engine == "vllm" and len(quants) > 1:
        raise SystemExit("--engine vllm: one --quant per process (its engine's memory is freed at exit only)")
    SHAPES[:] = [tuple(int(n) for n in shape.split("x")) for shape in a.shapes.split(",")]
    conc = [int(c) for c in a.concurrency.split(",")] or CONCURRENCY
    bw = copy_bandwidth()
    for quant in quants:
        if quant not in SCHEMES:
            raise SystemExit(f"--quant: {quant!r} is not one of {', '.join(SCHEMES)}")
        ckpt = checkpoint(a.arch, quant)
        # Our block-FP8 weights run on the FP8 kernels only with RTP_LLM_CUDA_FP8_BLOCK=1 (else widened).
        block_kernels = os.environ.get("RTP_LLM_CUDA_FP8_BLOCK") == "1"
        out = lambda r: emit(a.out, dict(r, arch=a.arch, quant=quant, engine=a.engine,  # noqa: E731
                                         gpu=torch.cuda.get_device_name(), fp8_block_kernels=block_kernels,
                                         kv_cache_dtype=a.kv_cache_dtype))
        floor = read_floor_bytes(ckpt, AT_LOAD.get(quant) == "int8")
        out({"mode": "floor", "read_bytes": floor, "copy_bandwidth_GBps": bw / 1e9, "tpot_floor_ms": floor / bw * 1e3})
        if a.engine == "ours":
            offline(ckpt, out, max_batch_size=a.max_batch_size, concurrency=conc, quantization=AT_LOAD.get(quant),
                    kv_cache_dtype=a.kv_cache_dtype)
        elif quant in AT_LOAD:
            raise SystemExit(f"--quant {quant} is our --quantization at load: vLLM has no such scheme")
        else:
            vllm_offline(ckpt, out, max_batch_size=a.max_batch_size, concurrency=conc, load_format="auto",
                         kv_cache_dtype=a.kv_cache_dtype)


if __name__ == "__main__":
    main()
