"""Small-batch projections (GEMV) of the CUDA backend: decode batches of up to GEMV_MAX_ROWS
rows against nn.Linear's [N, K] weights, optionally with SiLU-and-mul in the epilogue."""

import torch
import triton
import triton.language as tl

from rtp_llm.device.cuda.kernels.launch import launch_options, pdl_enter


GEMV_MAX_ROWS = 4


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether gemv() beats cuBLAS (F.linear on the same [N, K] weight) for this projection, as
    measured on an H200 inside CUDA graphs over Qwen3-0.6B and 8B (TP 1 and 2) shapes
    (`bench_gemv`; readings in docs/benchmarks.md): one row always (cuBLAS is slower over [N, K]
    or [K, N] memory alike); 2 and 4 rows only where N <= 1024. Never for fp32: the parity
    reference keeps cuBLAS, i.e. HF's very sums."""
    if weight.dtype == torch.float32:
        return False
    if x.dim() != 2 or x.dtype != weight.dtype or x.stride(1) != 1 or not weight.is_contiguous():
        return False
    m = x.shape[0]
    n = weight.shape[0]
    if m == 0 or m > GEMV_MAX_ROWS:
        return False
    return m == 1 or n <= 1024


@triton.jit
def _scaled(w, s_ptr, rows, ks, K, stride_s, nmask, SCALE: tl.constexpr, BN_S: tl.constexpr, BK_S: tl.constexpr):
    """A weight tile [BLOCK_N, BLOCK_K] of rows `rows` and inputs `ks` in fp32; SCALE 2 (FP8
    block scales): each weight times its block's scale (gathered per element: the scales are a
    few KB, read from L1, and the tiles stay as long as the unscaled ones')."""
    w = w.to(tl.float32)
    if SCALE == 2:
        w = w * tl.load(s_ptr + (rows // BN_S)[:, None] * stride_s + (ks // BK_S)[None, :],
                        mask=nmask[:, None] & (ks < K)[None, :], other=0.0)
    return w


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, s_ptr, out_ptr, N, K, stride_x, stride_out, stride_s, M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr, SCALE: tl.constexpr,
                 BN_S: tl.constexpr, BK_S: tl.constexpr, PDL: tl.constexpr):
    """out[m, n] = sum_k x[m, k] w[n, k] for M (<= 4) rows: each program streams BLOCK_N weight
    rows, accumulating [BLOCK_N, BLOCK_K] fp32 products per x row and summing over k at the
    end. Rows after the first re-read the program's weight slice, from L2. GATED: w is
    [2 N, K], gate rows then up rows, and out[m, n] = silu(gate) * up, rounded as HF rounds
    gate_proj, act_fn and the product (silu_and_mul's roundings). SCALE: 0 the weight's values
    as they are; FP8 weights (kernels/fp8.py) times s [rows / BN_S, K / BK_S] fp32: 1 one scale
    per row (applied to the row's sum), 2 one per BN_S x BK_S block (applied per tile)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * K
    u_rows = w_ptr + (offs_n + N).to(tl.int64)[:, None] * K
    # Weights are never written by a previous kernel: the first tile is loaded before the
    # PDL wait, overlapping the previous kernel's tail.
    offs_k = tl.arange(0, BLOCK_K)
    wmask = nmask[:, None] & (offs_k < K)[None, :]
    w_first = _scaled(tl.load(w_rows + offs_k[None, :], mask=wmask, other=0.0), s_ptr, offs_n, offs_k, K, stride_s,
                      nmask, SCALE, BN_S, BK_S)
    u_first = w_first
    if GATED:
        u_first = _scaled(tl.load(u_rows + offs_k[None, :], mask=wmask, other=0.0), s_ptr, offs_n + N, offs_k,
                          K, stride_s, nmask, SCALE, BN_S, BK_S)
    pdl_enter(PDL)
    dt = out_ptr.dtype.element_ty
    for m in tl.static_range(M):
        x = tl.load(x_ptr + m * stride_x + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)[None, :]
        if m == 0:
            acc = w_first * x
            acc_u = u_first * x
        else:
            acc = _scaled(tl.load(w_rows + offs_k[None, :], mask=wmask, other=0.0), s_ptr, offs_n, offs_k, K,
                          stride_s, nmask, SCALE, BN_S, BK_S) * x
            acc_u = acc
            if GATED:
                acc_u = _scaled(tl.load(u_rows + offs_k[None, :], mask=wmask, other=0.0), s_ptr, offs_n + N, offs_k,
                                K, stride_s, nmask, SCALE, BN_S, BK_S) * x
        for k0 in range(BLOCK_K, K, BLOCK_K):
            ks = k0 + offs_k
            kmask = ks < K
            x = tl.load(x_ptr + m * stride_x + ks, mask=kmask, other=0.0).to(tl.float32)[None, :]
            mk = nmask[:, None] & kmask[None, :]
            acc += _scaled(tl.load(w_rows + ks[None, :], mask=mk, other=0.0), s_ptr, offs_n, ks, K, stride_s, nmask,
                           SCALE, BN_S, BK_S) * x
            if GATED:
                acc_u += _scaled(tl.load(u_rows + ks[None, :], mask=mk, other=0.0), s_ptr, offs_n + N, ks, K,
                                 stride_s, nmask, SCALE, BN_S, BK_S) * x
        res = tl.sum(acc, 1)
        if SCALE == 1:
            res = res * tl.load(s_ptr + offs_n * stride_s, mask=nmask, other=0.0)
        if GATED:
            res_u = tl.sum(acc_u, 1)
            if SCALE == 1:
                res_u = res_u * tl.load(s_ptr + (offs_n + N) * stride_s, mask=nmask, other=0.0)
            g = res.to(dt).to(tl.float32)
            a = (g * tl.sigmoid(g)).to(dt).to(tl.float32)
            res = a * res_u.to(dt).to(tl.float32)
        tl.store(out_ptr + m * stride_out + offs_n, res.to(dt), mask=nmask)


def gemv_config(n: int, k: int, gated: bool = False, fp8_rows: bool = False):
    """(BLOCK_N, BLOCK_K, num_warps) for a [N, K] weight (gated: [2 I, K], BLOCK_N counting
    gate and up rows). From an H200 sweep with PDL over the Qwen3-0.6B and 8B (TP 1 and 2)
    projections (`bench_gemv --sweep`): long K tiles win everywhere (the first tile is loaded
    before the PDL wait), and a program should stream ~8K weights (readings in
    docs/benchmarks.md). fp8_rows: FP8 weights with a scale per row, from `bench_gemv --sweep
    --fp8` over Qwen3-8B's projections (K >= 2048; smaller K keeps bf16's tiles, unmeasured):
    a byte a weight, so more rows a program than bf16's."""
    if fp8_rows and k >= 2048:
        if n > k:  # qkv, gate_up (gated too)
            return 8, 512, 4
        return (8 if k <= 4096 else 2), min(2048, k // 4), 4
    block_k = min(1024, triton.next_power_of_2(k))
    if gated:
        return _pow2_floor(max(2, min(8, 8192 // k))), min(512, block_k), 4
    if n <= 1024:
        return 1, block_k, 4  # few rows: one per program, or too few programs
    return _pow2_floor(max(1, min(4, 8192 // k))), block_k, 4


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def gemv(x: torch.Tensor, weight: torch.Tensor, config=None, out: torch.Tensor = None,
         gated: bool = False, scale: torch.Tensor = None, block=None) -> torch.Tensor:
    """x: [M, K], M <= GEMV_MAX_ROWS, unit stride along K; weight: [N, K] contiguous (nn.Linear's
    layout) -> [M, N] in x's dtype, into `out` when given (contiguous). gated: weight is
    [2 I, K] (gate then up) and the result silu(x gate^T) * (x up^T), [M, I]. An FP8 weight
    comes with its scale fp32 [ceil(N / bn), ceil(K / bk)] and block (bn, bk) (fp8.Fp8Linear):
    one scale per row (bn 1, bk >= K) or bn x bk blocks."""
    m = x.shape[0]
    n, k = weight.shape
    assert m <= GEMV_MAX_ROWS and x.shape[1] == k and x.stride(1) == 1 and weight.is_contiguous()
    mode, (bn_s, bk_s) = 0, (1, 1)
    if scale is not None:
        bn_s, bk_s = block
        mode = 1 if bn_s == 1 and bk_s >= k else 2
    block_n, block_k, num_warps = config or gemv_config(n, k, gated, fp8_rows=mode == 1)
    if gated:
        assert n % 2 == 0, "gated: weight rows are gate then up, 2 I of them"
        n //= 2
        block_n = max(1, block_n // 2)  # a program streams BLOCK_N gate and BLOCK_N up rows
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.is_contiguous() and out.dtype == x.dtype
    if m == 0:
        return out
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, weight, weight if scale is None else scale, out, n, k, x.stride(0),
                                             out.stride(0), 0 if scale is None else scale.stride(0), M=m,
                                             BLOCK_N=block_n, BLOCK_K=block_k, GATED=gated, SCALE=mode, BN_S=bn_s,
                                             BK_S=bk_s, num_warps=num_warps, **launch_options())
    return out
