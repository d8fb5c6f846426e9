"""GPTQ / AWQ projections on the GPU (kernels/wint.py, and at 4 bits kernels/wint_mma.py's tensor-core
path: mma_us) against bf16's: per projection of one rank of ARCH, the int GEMV at decode rows and
the int GEMM at more, beside the bf16 Triton gemv and
cuBLAS on the same shapes, each timed inside a CUDA graph of calls over distinct weights (so the
L2 does not hold them; bench_gemv's method). Prints microseconds per call and the weight bytes
read per second; --sweep also tries GEMV configs at one row and GEMM tiles at each row count
(how wint.gemv_config and gemm_config were chosen), mma the tensor-core GEMV's chunks a warp.
Random codes: speed does not depend on them.

    python -m rtp_llm.tools.bench_wint [--arch qwen3-8b] [--bits 4] [--group 128] [--sweep gemv,gemm,mma]"""

import argparse
import json

import torch

from rtp_llm.tools.bench_gemv import graph_us, projection_shapes


def random_int_linear(n: int, k: int, bits: int, group: int, dev: str):
    from rtp_llm.device.cuda import kernels as K

    g = -(-k // group)
    words = torch.randint(-2 ** 31, 2 ** 31 - 1, (n, k * bits // 32), dtype=torch.int32, device=dev)
    scale = (torch.rand(n, g, device=dev) * 0.01).half()
    zero = torch.full((n, g), 1 << (bits - 1), dtype=torch.int16, device=dev)
    return K.IntLinear(words, scale, zero, None, group, bits, k)


def _bytes(w) -> int:
    return w.qweight.numel() * 4 + w.scale.numel() * 2 + w.zero.numel() * 2


def _sweep_gemv(x, ws, copies, gated):
    from rtp_llm.device.cuda.kernels import wint

    res = {}
    block_w = wint.gemv_config(ws[0].qweight.shape[0], ws[0])[1]
    # (BLOCK_N, BLOCK_W, RUNS, num_warps, SPLIT): programs of 16-128 rows over 1-4 warps (a thread's
    # inputs serve BLOCK_N / (32 num_warps / BLOCK_W) rows), 1-2 runs of words an iteration, each
    # row's words in 1-16 ranges (one program each)
    configs = [(16, block_w, 1, 4, 1)]
    configs += [(bn, block_w, 1, 2, split) for bn in (64, 128) for split in (4, 8, 16)]
    configs += [(bn, block_w, 1, warps, split) for bn, warps in ((32, 1), (64, 1), (128, 4)) for split in (8, 16)]
    configs += [(64, block_w, 2, 2, split) for split in (8, 16)]
    for cfg in configs:
        try:
            res[str(cfg)] = graph_us(lambda: [wint.gemv(x, w, gated=gated, config=cfg) for w in ws], copies)
        except Exception as e:  # (a tile too large for the registers or shared memory)
            res[str(cfg)] = repr(e)[:60]
    timed = [kv for kv in res.items() if isinstance(kv[1], float)]
    return sorted(timed, key=lambda kv: kv[1])[:5]


def _sweep_gemm(x, ws, copies):
    from rtp_llm.device.cuda.kernels import wint

    res = {}
    for bm in (16, 64, 128):
        for bn in (64, 128):
            for nw, ns in ((4, 3), (8, 3)):
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, num_warps=nw, num_stages=ns)
                try:
                    res[json.dumps(cfg)] = graph_us(lambda: [wint.gemm(x, w, config=cfg) for w in ws], copies)
                except Exception:  # (out of shared memory)
                    pass
    return sorted(res.items(), key=lambda kv: kv[1])[:4]


def _sweep_mma(x, ps, copies, gated):
    from rtp_llm.device.cuda.kernels import wint_mma

    res = {cpw: graph_us(lambda: [wint_mma.gemv(x, p, gated=gated, cpw=cpw) for p in ps], copies)
           for cpw in (2, 4, 6, 8)}
    return sorted(res.items(), key=lambda kv: kv[1])[:3]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="qwen3-8b")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--rows", default="1,2,4,16,64,256,1024,4096")
    p.add_argument("--sweep", default="", help="comma list of gemv, gemm: the configs to try")
    p.add_argument("--weights_gb", type=float, default=1.0, help="distinct int weights per graph, in GB")
    a = p.parse_args()
    from rtp_llm.device.cuda import kernels as K
    from rtp_llm.device.cuda.kernels import wint, wint_mma

    torch.manual_seed(0)
    dev = "cuda"
    for name, k, n in projection_shapes(a.arch, a.tp):
        copies = max(4, min(32, int(a.weights_gb * 8e9 // (k * n * a.bits))))
        ws = [random_int_linear(n, k, a.bits, a.group, dev) for _ in range(copies)]
        bf = [wint.dequantize(w, torch.bfloat16) for w in ws[:max(4, copies // 4)]]
        nbytes = _bytes(ws[0])
        ps = [wint_mma.pack(w, torch.bfloat16) for w in ws] if wint_mma.supports(ws[0], torch.bfloat16) else []
        for m in (int(r) for r in a.rows.split(",")):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            row = {"arch": a.arch, "proj": name, "K": k, "N": n, "rows": m, "bits": a.bits, "group": a.group,
                   "int_us": graph_us(lambda: [K.wint_linear(x, w) for w in ws], copies),
                   "bf16_us": graph_us(lambda: [K.gemv(x, w) if K.use_gemv(x, w) else torch.nn.functional.linear(x, w)
                                                for w in bf], len(bf))}
            row["int_GBps"] = nbytes / row["int_us"] / 1e3
            if ps:
                row["mma_us"] = graph_us(lambda: [K.int4_mma_linear(x, p) for p in ps], copies)
                row["mma_GBps"] = nbytes / row["mma_us"] / 1e3
                if name == "gate_up" and m <= wint_mma.MMA_MAX_ROWS:
                    row["mma_gated_us"] = graph_us(lambda: [K.int4_mma_gate_up_silu(x, p, K.silu_and_mul) for p in ps],
                                                   copies)
                if "mma" in a.sweep and m == 1:
                    row["best_mma"] = _sweep_mma(x, ps, copies, False)
                    if name == "gate_up":
                        row["best_gated_mma"] = _sweep_mma(x, ps, copies, True)
            if m <= K.GEMV_MAX_ROWS:
                row["gemv_config"] = str(wint.gemv_config(n, ws[0]))
            if m > K.GEMV_MAX_ROWS:
                row["gemm_us"] = graph_us(lambda: [wint.gemm(x, w) for w in ws], copies)
                row["dequant_cublas_us"] = graph_us(
                    lambda: [torch.nn.functional.linear(x, wint.dequantize(w, torch.bfloat16)) for w in ws[:4]], 4)
                if "gemm" in a.sweep:
                    row["best_gemm"] = _sweep_gemm(x, ws, copies)
            elif name == "gate_up":
                row["int_gated_us"] = graph_us(lambda: [K.wint_gate_up_silu(x, w, K.silu_and_mul) for w in ws], copies)
            if "gemv" in a.sweep and m == 1:
                row["best_gemv"] = _sweep_gemv(x, ws, copies, False)
                if name == "gate_up":
                    row["best_gated_gemv"] = _sweep_gemv(x, ws, copies, True)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
