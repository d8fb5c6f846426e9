"""Decode-sized projections on the GPU: cuBLAS over [K, N] (x @ w) and over [N, K] (F.linear),
the Triton gemv, and what the CUDA backend picks (kernels.use_gemv), each
timed inside a CUDA graph of calls over distinct weights (so the 50 MB L2 does not hold them),
as in a decode graph, and for gate-up also with SiLU-and-mul (cuBLAS then silu_and_mul, or
the gated gemv). Prints microseconds per call; --sweep also tries gemv block configs at one
row (how kernels.gemv_config was chosen), gated ones for gate-up.

    python -m rtp_llm.tools.bench_gemv [--arch qwen3-0.6b] [--tp 1] [--rows 1,2,4,8,16] [--sweep] [--fp8]"""

import argparse
import json

import torch


def projection_shapes(arch: str, tp: int):
    """(name, K, N) of one rank's projections: column-parallel qkv and gate-up, row-parallel o
    and down."""
    from rtp_llm.tools.random_checkpoint import ARCHS

    c = ARCHS[arch]
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    d = c.get("head_dim", hidden // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * d // tp, max(1, c["num_key_value_heads"] // tp) * d
    return [("qkv", hidden, q + 2 * kv), ("o", q, hidden), ("gate_up", hidden, 2 * inter // tp),
            ("down", inter // tp, hidden)]


def graph_us(fn, calls: int, iters: int = 10) -> float:
    """Microseconds per call of fn (which makes `calls` calls) replayed from a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / (iters * calls))
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="qwen3-0.6b")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--rows", default="1,2,4,8,16")
    p.add_argument("--sweep", action="store_true", help="gemv block configs at one row")
    p.add_argument("--weights_gb", type=float, default=2.0, help="distinct weights per graph, in GB")
    p.add_argument("--fp8", action="store_true", help="e4m3 weights with a scale per row (kernels/fp8.py's GEMV "
                   "path); cuBLAS columns are bf16's")
    a = p.parse_args()
    from rtp_llm.device.cuda import kernels as K

    torch.manual_seed(0)
    dev = "cuda"
    for name, k, n in projection_shapes(a.arch, a.tp):
        copies = max(4, min(28, int(a.weights_gb * 1e9 // (k * n * 2))))
        w_nk = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        w_kn = [w.t().contiguous() for w in w_nk]
        kw = {}
        if a.fp8:  # the gemv's operands become FP8 weights, one scale a row; cuBLAS keeps bf16's
            kw = dict(scale=torch.ones(n, 1, device=dev), block=(1, k))
            w_g = [w.to(torch.float8_e4m3fn) for w in w_nk]
        else:
            w_g = w_nk
        for m in (int(r) for r in a.rows.split(",")):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            row = {"arch": a.arch, "tp": a.tp, "proj": name, "fp8": a.fp8, "K": k, "N": n, "rows": m,
                   "cublas_kn_us": graph_us(lambda: [x @ w for w in w_kn], copies),
                   "cublas_nk_us": graph_us(lambda: [torch.nn.functional.linear(x, w) for w in w_nk], copies)}
            if m <= K.GEMV_MAX_ROWS:
                row["gemv_us"] = graph_us(lambda: [K.gemv(x, w, **kw) for w in w_g], copies)
            linear = (lambda w: K.gemv(x, w) if K.use_gemv(x, w) else torch.nn.functional.linear(x, w))
            row["backend_us"] = graph_us(lambda: [linear(w) for w in w_nk], copies)
            if name == "gate_up" and m <= K.GEMV_MAX_ROWS:
                # With SiLU-and-mul: its own kernel after cuBLAS, or in the gated gemv's epilogue.
                row["cublas_kn_silu_us"] = graph_us(lambda: [K.silu_and_mul(x @ w) for w in w_kn], copies)
                row["gated_gemv_us"] = graph_us(lambda: [K.gemv(x, w, gated=True, **kw) for w in w_g], copies)
                row["gated_gemv_config"] = str(K.gemv_config(n, k, gated=True))
            print(json.dumps(row), flush=True)
        if a.sweep:
            x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
            sweep = {}
            for cfg in [(bn, bk, nw) for bn in (1, 2, 4, 8) for bk in (128, 256, 512, 1024, 2048) for nw in (4, 8)]:
                sweep[str(cfg)] = graph_us(lambda: [K.gemv(x, w, cfg, **kw) for w in w_g], copies)
            best = sorted(sweep.items(), key=lambda kv: kv[1])[:4]
            print(json.dumps({"arch": a.arch, "tp": a.tp, "proj": name, "K": k, "N": n, "rows": 1, "fp8": a.fp8,
                              "gemv_config": str(K.gemv_config(n, k)), "best_configs_us": best}), flush=True)
            if name == "gate_up":  # the gated gemv: BLOCK_N gate rows and BLOCK_N up rows per program
                gated = {}
                for cfg in [(bn, bk, nw) for bn in (2, 4, 8) for bk in (256, 512, 1024, 2048) for nw in (4, 8)]:
                    gated[str(cfg)] = graph_us(lambda: [K.gemv(x, w, cfg, gated=True, **kw) for w in w_g], copies)
                print(json.dumps({"arch": a.arch, "tp": a.tp, "proj": "gate_up_gated", "K": k, "N": n, "rows": 1,
                                  "best_configs_us": sorted(gated.items(), key=lambda kv: kv[1])[:4]}), flush=True)


if __name__ == "__main__":
    main()
