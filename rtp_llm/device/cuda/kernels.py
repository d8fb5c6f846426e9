"""Triton kernels of the CUDA backend. Shapes: T tokens in the step, S streams, H query heads,
Hkv KV heads (G = H / Hkv per group), D head_dim. KV cache of one layer: K and V each
[num_blocks, page, Hkv, D] contiguous, so token slot s of head h starts at (s * Hkv + h) * D.

Rounding follows HF transformers in the model dtype (e.g. RMSNorm normalizes in fp32, casts,
then scales; rotary rounds each product) so that greedy tokens match HF's, not just nearly."""

import functools
import os

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_LOG2E = 1.4426950408889634


# ---------------------------------------------------------------- programmatic dependent launch
#
# A decode step is ~9 short kernels per layer, so the gap between two kernels is a large part
# of it. With PDL (Hopper and later) a kernel is launched while its predecessor still runs; it
# waits in pdl_enter() (griddepcontrol.wait: the predecessor has completed and its writes are
# visible) before touching anything the predecessor may write, and then lets its own successor
# launch. Invariant: every kernel launched with launch_pdl calls pdl_enter() unconditionally,
# before its first read of a predecessor's output and before its first write, so a kernel
# completes only after its predecessor did and ordering stays transitive along the stream.


@functools.lru_cache(maxsize=None)
def pdl() -> bool:
    """Whether the kernels launch with PDL: a Hopper or later GPU, not Triton's interpreter,
    and RTP_LLM_CUDA_PDL not 0."""
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("RTP_LLM_CUDA_PDL", "1") == "0":
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def launch_options() -> dict:
    return dict(PDL=True, launch_pdl=True) if pdl() else dict(PDL=False)


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(int(n)))


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 runs are the parity reference: no TF32 (torch's matmul default on CUDA is also off).
    return "ieee" if dtype == torch.float32 else "tf32"


# ---------------------------------------------------------------- RMSNorm, residual add


@triton.jit
def weighted_rms_norm(x, w, D, eps):
    """weight * rms_norm(x) of one row x [BLOCK] (the dtype; masked lanes 0), w [BLOCK] fp32:
    the norm in fp32, rounded to the dtype before the weight multiplies, as HF's Qwen3RMSNorm."""
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / D
    return w * (xf * tl.rsqrt(var + eps)).to(x.dtype).to(tl.float32)


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, D, stride_x, stride_res, stride_out, eps,
                     HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0)
    if HAS_RES:  # residual += x, rounded to the dtype as torch's add does
        r = tl.load(res_ptr + row * stride_res + cols, mask=m, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(r.dtype)
        tl.store(res_ptr + row * stride_res + cols, x, mask=m)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, weighted_rms_norm(x, w, D, eps).to(out_ptr.dtype.element_ty), mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor = None) -> torch.Tensor:
    """x: [N, D] (rows may be strided) -> [N, D]. With residual [N, D]: residual += x first and
    the norm is of the sum."""
    n, d = x.shape
    assert x.stride(1) == 1
    out = torch.empty((n, d), dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    res = residual if residual is not None else x
    _rms_norm_kernel[(n,)](x, res, weight, out, d, x.stride(0), res.stride(0), out.stride(0), eps,
                           HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(d),
                           num_warps=4 if d <= 4096 else 8, **launch_options())
    return out


# ---------------------------------------------------------------- rotary (rotate_half layout), optional q/k norm


@triton.jit
def _cos_sin(cos_ptr, sin_ptr, pos, dt, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """[1, BLOCK_HALF] cos and sin rows of position `pos`, cast to the dtype first as HF does."""
    ds = tl.arange(0, BLOCK_HALF)
    dm = ds < HALF
    c = tl.load(cos_ptr + pos * HALF + ds, mask=dm, other=0.0).to(dt).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + pos * HALF + ds, mask=dm, other=0.0).to(dt).to(tl.float32)[None, :]
    return c, s


@triton.jit
def _norm_rotate_heads(ptr, stride_h, nh, w_ptr, eps, c, s, HAS_NORM: tl.constexpr, HALF: tl.constexpr,
                       BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Heads [nh, 2 * HALF] at ptr: per-head RMSNorm (Qwen3's q/k norm) then rotary, in place;
    returns the result's halves for the cache write."""
    hs = tl.arange(0, BLOCK_H)
    ds = tl.arange(0, BLOCK_HALF)
    m = (hs[:, None] < nh) & (ds[None, :] < HALF)
    p1 = ptr + hs[:, None] * stride_h + ds[None, :]
    x1 = tl.load(p1, mask=m, other=0.0)
    x2 = tl.load(p1 + HALF, mask=m, other=0.0)
    dt = x1.dtype
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    if HAS_NORM:
        rstd = tl.rsqrt((tl.sum(f1 * f1, 1) + tl.sum(f2 * f2, 1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(w_ptr + ds, mask=ds < HALF, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + ds, mask=ds < HALF, other=0.0).to(tl.float32)[None, :]
        f1 = (w1 * (f1 * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        f2 = (w2 * (f2 * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    o1 = ((f1 * c).to(dt).to(tl.float32) + (-(f2 * s)).to(dt).to(tl.float32)).to(dt)
    o2 = ((f2 * c).to(dt).to(tl.float32) + (f1 * s).to(dt).to(tl.float32)).to(dt)
    tl.store(p1, o1, mask=m)
    tl.store(p1 + HALF, o2, mask=m)
    return o1, o2


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, pos_ptr, cos_ptr, sin_ptr, stride_qt, stride_qh, stride_kt, stride_kh, H, HKV,
                   HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
                   PDL: tl.constexpr):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    c, s = _cos_sin(cos_ptr, sin_ptr, pos, q_ptr.dtype.element_ty, HALF, BLOCK_HALF)
    # No norm: the weight pointer and eps are unused.
    _norm_rotate_heads(q_ptr + t * stride_qt, stride_qh, H, q_ptr, 0.0, c, s, False, HALF, BLOCK_HQ, BLOCK_HALF)
    _norm_rotate_heads(k_ptr + t * stride_kt, stride_kh, HKV, k_ptr, 0.0, c, s, False, HALF, BLOCK_HK, BLOCK_HALF)


def rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """In place. q: [T, H, D], k: [T, Hkv, D] (last dim contiguous); positions [T];
    cos/sin: [max_positions, D / 2] fp32."""
    t, h, d = q.shape
    if t == 0:
        return
    assert q.stride(2) == 1 and k.stride(2) == 1 and cos.is_contiguous() and sin.is_contiguous()
    half = d // 2
    _rotary_kernel[(t,)](q, k, positions, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1), h,
                         k.shape[1], HALF=half, BLOCK_HQ=triton.next_power_of_2(h),
                         BLOCK_HK=triton.next_power_of_2(k.shape[1]), BLOCK_HALF=triton.next_power_of_2(half),
                         **launch_options())


# ---------------------------------------------------------------- fused: q/k norm, rotary, KV write in one launch


@triton.jit
def _qkv_to_cache_kernel(qkv_ptr, qw_ptr, kw_ptr, pos_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, slot_ptr, stride_t, eps,
                         H, HKV, HAS_NORM: tl.constexpr, HALF: tl.constexpr, BLOCK_HQ: tl.constexpr,
                         BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    row = qkv_ptr + t * stride_t
    D: tl.constexpr = 2 * HALF
    pos = tl.load(pos_ptr + t).to(tl.int64)
    ds = tl.arange(0, BLOCK_HALF)
    dm = ds < HALF
    c, s = _cos_sin(cos_ptr, sin_ptr, pos, qkv_ptr.dtype.element_ty, HALF, BLOCK_HALF)
    _norm_rotate_heads(row, D, H, qw_ptr, eps, c, s, HAS_NORM, HALF, BLOCK_HQ, BLOCK_HALF)
    k1, k2 = _norm_rotate_heads(row + H * D, D, HKV, kw_ptr, eps, c, s, HAS_NORM, HALF, BLOCK_HK, BLOCK_HALF)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:  # < 0: a padding row of a captured graph
        hs = tl.arange(0, BLOCK_HK)
        m = (hs[:, None] < HKV) & dm[None, :]
        dst = (slot * HKV + hs[:, None]) * D + ds[None, :]
        tl.store(kc_ptr + dst, k1, mask=m)
        tl.store(kc_ptr + dst + HALF, k2, mask=m)
        vsrc = row + (H + HKV) * D + hs[:, None] * D + ds[None, :]
        tl.store(vc_ptr + dst, tl.load(vsrc, mask=m), mask=m)
        tl.store(vc_ptr + dst + HALF, tl.load(vsrc + HALF, mask=m), mask=m)


def qkv_to_cache(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, q_norm, k_norm, eps: float,
                 positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """In place on qkv [T, (H + 2 Hkv) D] (rows contiguous): q and k get the optional per-head
    RMSNorm (weights [D]) and rotary; k and v are written to kv [2, blocks, page, Hkv, D] at
    slot_mapping [T] (< 0: skipped). One launch instead of five."""
    t = qkv.shape[0]
    if t == 0:
        return
    assert qkv.stride(1) == 1 and head_dim % 2 == 0
    half = head_dim // 2
    has_norm = q_norm is not None
    _qkv_to_cache_kernel[(t,)](qkv, q_norm if has_norm else qkv, k_norm if has_norm else qkv, positions, cos, sin,
                               kv[0], kv[1], slot_mapping, qkv.stride(0), eps, num_heads, num_kv_heads,
                               HAS_NORM=has_norm, HALF=half, BLOCK_HQ=triton.next_power_of_2(num_heads),
                               BLOCK_HK=triton.next_power_of_2(num_kv_heads),
                               BLOCK_HALF=triton.next_power_of_2(half), num_warps=4, **launch_options())


# ---------------------------------------------------------------- SiLU-and-mul


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, I, stride_x, stride_out, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < I
    g = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0)
    u = tl.load(x_ptr + row * stride_x + I + cols, mask=m, other=0.0)
    gf = g.to(tl.float32)
    a = (gf * tl.sigmoid(gf)).to(g.dtype).to(tl.float32)  # HF: act(gate) in the dtype, then * up
    tl.store(out_ptr + row * stride_out + cols, (a * u.to(tl.float32)).to(g.dtype), mask=m)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2 * I] (gate then up) -> [T, I]."""
    t, two_i = x.shape
    i = two_i // 2
    out = torch.empty((t, i), dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    block = min(1024, triton.next_power_of_2(i))
    _silu_and_mul_kernel[(t, triton.cdiv(i, block))](x, out, i, x.stride(0), out.stride(0), BLOCK=block,
                                                     **launch_options())
    return out


# ---------------------------------------------------------------- small-batch projections

GEMV_MAX_ROWS = 4


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether gemv() beats cuBLAS (F.linear on the same [N, K] weight) for this projection.
    Measured on an H200 inside CUDA graphs over Qwen3-0.6B and 8B (TP 1 and 2) shapes
    (`bench_gemv`): one row, 4-200 MB weights: gemv 2.4-46 us against cuBLAS's 5.3-48 us (over
    [N, K] or [K, N] memory alike); 2 and 4 rows: better only where N <= 1024 (Qwen3-0.6B's o
    projection: 4.4 / 7.0 us against 5.8 us). Never for fp32: the parity reference keeps
    cuBLAS, i.e. HF's very sums."""
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
def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, stride_x, stride_out, M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, GATED: tl.constexpr, PDL: tl.constexpr):
    """out[m, n] = sum_k x[m, k] w[n, k] for M (<= 4) rows: each program streams BLOCK_N weight
    rows, accumulating [BLOCK_N, BLOCK_K] fp32 products per x row and summing over k at the
    end. Rows after the first re-read the program's weight slice, from L2. GATED: w is
    [2 N, K], gate rows then up rows, and out[m, n] = silu(gate) * up, rounded as HF rounds
    gate_proj, act_fn and the product (silu_and_mul's roundings)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * K
    u_rows = w_ptr + (offs_n + N).to(tl.int64)[:, None] * K
    # Weights are never written by a previous kernel: the first tile is loaded before the
    # PDL wait, overlapping the previous kernel's tail.
    offs_k = tl.arange(0, BLOCK_K)
    wmask = nmask[:, None] & (offs_k < K)[None, :]
    w_first = tl.load(w_rows + offs_k[None, :], mask=wmask, other=0.0)
    u_first = w_first
    if GATED:
        u_first = tl.load(u_rows + offs_k[None, :], mask=wmask, other=0.0)
    pdl_enter(PDL)
    dt = out_ptr.dtype.element_ty
    for m in tl.static_range(M):
        x = tl.load(x_ptr + m * stride_x + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)[None, :]
        if m == 0:
            acc = w_first.to(tl.float32) * x
            acc_u = u_first.to(tl.float32) * x
        else:
            acc = tl.load(w_rows + offs_k[None, :], mask=wmask, other=0.0).to(tl.float32) * x
            acc_u = acc
            if GATED:
                acc_u = tl.load(u_rows + offs_k[None, :], mask=wmask, other=0.0).to(tl.float32) * x
        for k0 in range(BLOCK_K, K, BLOCK_K):
            ks = k0 + offs_k
            kmask = ks < K
            x = tl.load(x_ptr + m * stride_x + ks, mask=kmask, other=0.0).to(tl.float32)[None, :]
            mk = nmask[:, None] & kmask[None, :]
            acc += tl.load(w_rows + ks[None, :], mask=mk, other=0.0).to(tl.float32) * x
            if GATED:
                acc_u += tl.load(u_rows + ks[None, :], mask=mk, other=0.0).to(tl.float32) * x
        res = tl.sum(acc, 1)
        if GATED:
            g = res.to(dt).to(tl.float32)
            a = (g * tl.sigmoid(g)).to(dt).to(tl.float32)
            res = a * tl.sum(acc_u, 1).to(dt).to(tl.float32)
        tl.store(out_ptr + m * stride_out + offs_n, res.to(dt), mask=nmask)


def gemv_config(n: int, k: int, gated: bool = False):
    """(BLOCK_N, BLOCK_K, num_warps) for a [N, K] weight (gated: [2 I, K], BLOCK_N counting
    gate and up rows). From an H200 sweep with PDL over the Qwen3-0.6B and 8B (TP 1 and 2)
    projections (`bench_gemv --sweep`): long K tiles win everywhere (the first tile is loaded
    before the PDL wait), and a program should stream ~8K weights: within 2-8% of each shape's
    best, 1.2-1.6x faster than the sweep before PDL picked for the 8B shapes."""
    block_k = min(1024, triton.next_power_of_2(k))
    if gated:
        return _pow2_floor(max(2, min(8, 8192 // k))), min(512, block_k), 4
    if n <= 1024:
        return 1, block_k, 4  # few rows: one per program, or too few programs
    return _pow2_floor(max(1, min(4, 8192 // k))), block_k, 4


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def gemv(x: torch.Tensor, weight: torch.Tensor, config=None, out: torch.Tensor = None,
         gated: bool = False) -> torch.Tensor:
    """x: [M, K], M <= GEMV_MAX_ROWS, unit stride along K; weight: [N, K] contiguous (nn.Linear's
    layout) -> [M, N] in x's dtype, into `out` when given (contiguous). gated: weight is
    [2 I, K] (gate then up) and the result silu(x gate^T) * (x up^T), [M, I]."""
    m = x.shape[0]
    n, k = weight.shape
    assert m <= GEMV_MAX_ROWS and x.shape[1] == k and x.stride(1) == 1 and weight.is_contiguous()
    block_n, block_k, num_warps = config or gemv_config(n, k, gated)
    if gated:
        assert n % 2 == 0, "gated: weight rows are gate then up, 2 I of them"
        n //= 2
        block_n = max(1, block_n // 2)  # a program streams BLOCK_N gate and BLOCK_N up rows
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.is_contiguous() and out.dtype == x.dtype
    if m == 0:
        return out
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, weight, out, n, k, x.stride(0), out.stride(0), M=m, BLOCK_N=block_n,
                                             BLOCK_K=block_k, GATED=gated, num_warps=num_warps, **launch_options())
    return out


# ---------------------------------------------------------------- overlap placeholders


@triton.jit(do_not_specialize=["n"])
def _resolve_placeholders_kernel(ids_ptr, prev_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    ids = tl.load(ids_ptr + offs, mask=m, other=0)
    ph = ids < 0
    prev = tl.load(prev_ptr + (-1 - ids), mask=m & ph, other=0)
    tl.store(ids_ptr + offs, tl.where(ph, prev.to(ids.dtype), ids), mask=m & ph)


def resolve_placeholders(token_ids: torch.Tensor, prev_tokens: torch.Tensor) -> None:
    """In place, one launch: ids -1 - r become prev_tokens[r]. token_ids [T], prev_tokens [N]."""
    n = token_ids.numel()
    if n:
        _resolve_placeholders_kernel[(triton.cdiv(n, 1024),)](token_ids, prev_tokens, n, BLOCK=1024,
                                                                   **launch_options())


# ---------------------------------------------------------------- KV cache write


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, stride_kt, stride_kh, stride_vt, stride_vh, HKV,
                     D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # padding rows of a captured graph
        return
    hs = tl.arange(0, BLOCK_H)
    ds = tl.arange(0, BLOCK_D)
    m = (hs[:, None] < HKV) & (ds[None, :] < D)
    dst = (slot * HKV + hs[:, None]) * D + ds[None, :]
    k = tl.load(k_ptr + t * stride_kt + hs[:, None] * stride_kh + ds[None, :], mask=m)
    v = tl.load(v_ptr + t * stride_vt + hs[:, None] * stride_vh + ds[None, :], mask=m)
    tl.store(kc_ptr + dst, k, mask=m)
    tl.store(vc_ptr + dst, v, mask=m)


def store_kv(k: torch.Tensor, v: torch.Tensor, kv: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k, v: [T, Hkv, D] -> kv: [2, blocks, page, Hkv, D] at slot_mapping [T] (< 0: skipped)."""
    t, hkv, d = k.shape
    if t == 0:
        return
    _store_kv_kernel[(t,)](k, v, kv[0], kv[1], slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1), hkv,
                           D=d, BLOCK_H=triton.next_power_of_2(hkv), BLOCK_D=triton.next_power_of_2(d),
                           **launch_options())


# ---------------------------------------------------------------- attention over the paged cache


@triton.jit
def _load_kv_tile(cache_ptr, block_tables_ptr, offs_n, nmask, kvh, HKV, D: tl.constexpr, PAGE: tl.constexpr,
                  offs_d, dmask):
    page = tl.load(block_tables_ptr + offs_n // PAGE, mask=nmask, other=0).to(tl.int64)
    slot = page * PAGE + offs_n % PAGE
    return tl.load(cache_ptr + (slot[:, None] * HKV + kvh) * D + offs_d[None, :],
                   mask=nmask[:, None] & dmask[None, :], other=0.0)


# stride_bt is the step's longest block table: left unspecialized, or every new value of it
# (and of its divisibility) would compile another variant in the middle of serving.
@triton.jit(do_not_specialize=["stride_bt"])
def _extend_attention_kernel(q_ptr, kc_ptr, vc_ptr, out_ptr, block_tables_ptr, query_starts_ptr, context_lens_ptr,
                             tile_stream_ptr, tile_start_ptr, scale_log2, stride_qt, stride_qh, stride_ot, stride_oh,
                             stride_bt, HKV, GROUP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                             BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
                             PDL: tl.constexpr):
    """One (tile of up to BLOCK_M query rows of one stream, head); the tile table says which
    stream and first row (stream < 0: a padding tile). Query row i of a stream with qlen rows
    and ctx context tokens sits at position ctx - qlen + i and sees keys 0..position; all of
    them, this step's included, are already in the cache."""
    pdl_enter(PDL)
    tile = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.load(tile_stream_ptr + tile)
    if s < 0:
        return
    m0 = tl.load(tile_start_ptr + tile)
    q0 = tl.load(query_starts_ptr + s)
    qlen = tl.load(query_starts_ptr + s + 1) - q0
    ctx = tl.load(context_lens_ptr + s)
    kvh = h // GROUP
    bt = block_tables_ptr + s.to(tl.int64) * stride_bt
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mmask = offs_m < qlen
    dmask = offs_d < D
    rows = (q0 + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=mmask[:, None] & dmask[None, :], other=0.0)
    pos = ctx - qlen + offs_m
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = tl.minimum(ctx, ctx - qlen + m0 + BLOCK_M)
    # Key 0 is in the first tile and visible to every row, so m_i is finite after it.
    for n0 in range(0, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < end
        k = _load_kv_tile(kc_ptr, bt, offs_n, nmask, kvh, HKV, D, PAGE, offs_d, dmask)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
        qk = tl.where((offs_n[None, :] <= pos[:, None]) & nmask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_kv_tile(vc_ptr, bt, offs_n, nmask, kvh, HKV, D, PAGE, offs_d, dmask)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=mmask[:, None] & dmask[None, :])


@triton.jit(do_not_specialize=["stride_bt"])
def _decode_split_kernel(q_ptr, kc_ptr, vc_ptr, o_part_ptr, lse_part_ptr, counter_ptr, out_ptr, block_tables_ptr,
                         query_starts_ptr, context_lens_ptr, scale_log2, stride_qt, stride_qh, stride_ot, stride_oh,
                         stride_bt, HKV, GROUP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                         NUM_SPLITS: tl.constexpr, GROUP_P2: tl.constexpr, SPLIT_TILE: tl.constexpr,
                         PREC: tl.constexpr, PDL: tl.constexpr):
    """One (stream, KV head, split): the group's G query heads (one token) against an equal
    share of the context. Writes each head's partial output and base-2 log-sum-exp (an empty
    split: lse = -inf); the last split of a (stream, KV head) to finish, counted by an atomic,
    merges them into out (one launch instead of a split kernel and a reduce kernel) and resets
    the counter for the next launch."""
    pdl_enter(PDL)
    s = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + s)
    chunk = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = sp * chunk
    end = tl.minimum(ctx, start + chunk)
    row = tl.load(query_starts_ptr + s).to(tl.int64)
    bt = block_tables_ptr + s.to(tl.int64) * stride_bt
    offs_g = tl.arange(0, BLOCK_G)
    gmask = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    q = tl.load(q_ptr + row * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < end
        k = _load_kv_tile(kc_ptr, bt, offs_n, nmask, kvh, HKV, D, PAGE, offs_d, dmask)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
        qk = tl.where(nmask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_kv_tile(vc_ptr, bt, offs_n, nmask, kvh, HKV, D, PAGE, offs_d, dmask)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + row * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])
    else:
        lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        base = (s.to(tl.int64) * HKV * GROUP + heads) * NUM_SPLITS + sp  # o_part: [S, H, NUM_SPLITS, D]
        tl.store(o_part_ptr + base[:, None] * D + offs_d[None, :], out, mask=gmask[:, None] & dmask[None, :])
        tl.store(lse_part_ptr + base, lse, mask=gmask)
        # Every thread's stores precede the release of the count (the threadfence-reduction
        # pattern); the acquire makes the other programs' partials visible to the last one.
        tl.debug_barrier()
        done = tl.atomic_add(counter_ptr + s * HKV + kvh, 1, sem="acq_rel", scope="gpu")
        if done == NUM_SPLITS - 1:
            _merge_splits(o_part_ptr, lse_part_ptr, out_ptr, row, stride_ot, stride_oh,
                          (s.to(tl.int64) * HKV + kvh) * GROUP, kvh * GROUP,
                          tl.cdiv(ctx, tl.maximum(chunk, 1)), GROUP, D,  # a padding stream: chunk = 0, none used
                          BLOCK_D, NUM_SPLITS, GROUP_P2, SPLIT_TILE)
            tl.atomic_xchg(counter_ptr + s * HKV + kvh, 0)


@triton.jit
def _merge_splits(o_part_ptr, lse_part_ptr, out_ptr, row, stride_ot, stride_oh, part_head0, out_head0, used,
                  GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr,
                  GROUP_P2: tl.constexpr, SPLIT_TILE: tl.constexpr):
    """The group's heads of out = the lse-weighted mean of the first `used` splits' partials
    (the rest are empty), SPLIT_TILE splits at a time with an online rescale. Loads bypass L1
    (.cg): other programs wrote the partials."""
    offs_g = tl.arange(0, GROUP_P2)
    gmask = offs_g < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    pbase = (part_head0 + offs_g) * NUM_SPLITS  # [G]
    m = tl.full([GROUP_P2], float("-inf"), tl.float32)
    l_sum = tl.zeros([GROUP_P2], tl.float32)
    acc = tl.zeros([GROUP_P2, BLOCK_D], tl.float32)
    for s0 in range(0, used, SPLIT_TILE):
        sps = s0 + tl.arange(0, SPLIT_TILE)
        smask = gmask[:, None] & (sps < used)[None, :]
        lse = tl.load(lse_part_ptr + pbase[:, None] + sps[None, :], mask=smask, other=float("-inf"),
                      cache_modifier=".cg")  # [G, T]
        m_new = tl.maximum(m, tl.max(lse, 1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        w = tl.where(lse > float("-inf"), tl.exp2(lse - m_safe[:, None]), 0.0)
        alpha = tl.where(m > float("-inf"), tl.exp2(m - m_safe), 0.0)
        o = tl.load(o_part_ptr + (pbase[:, None, None] + sps[None, :, None]) * D + offs_d[None, None, :],
                    mask=smask[:, :, None] & dmask[None, None, :], other=0.0, cache_modifier=".cg")  # [G, T, D]
        acc = acc * alpha[:, None] + tl.sum(o * w[:, :, None], 1)
        l_sum = l_sum * alpha + tl.sum(w, 1)
        m = m_new
    res = acc / tl.maximum(l_sum, 1e-30)[:, None]  # no non-empty split (a padding row): zeros
    tl.store(out_ptr + row * stride_ot + (out_head0 + offs_g)[:, None] * stride_oh + offs_d[None, :],
             res.to(out_ptr.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])


EXTEND_BLOCK_M = 64


def extend_tiles(query_lens: np.ndarray, out: np.ndarray = None):
    """The extend kernel's tile table: (stream, first query row) of every BLOCK_M-row tile, as an
    int32 array [2, n] (into `out` when given), columns past the tiles padded with stream -1.
    Without `out`, n is the tile count rounded up to a multiple of 4, so that both rows stay
    16-byte aligned (Triton specializes kernels on pointer alignment)."""
    tiles = -(-query_lens.astype(np.int64) // EXTEND_BLOCK_M)
    n = int(tiles.sum())
    if out is None:
        out = np.empty((2, -(-n // 4) * 4), dtype=np.int32)
    streams = np.repeat(np.arange(len(query_lens), dtype=np.int32), tiles)
    first = np.repeat(np.cumsum(tiles) - tiles, tiles)
    out[0, :n] = streams
    out[1, :n] = (np.arange(n) - first) * EXTEND_BLOCK_M
    out[0, n:] = -1
    return out


def extend_attention(q: torch.Tensor, kv: torch.Tensor, block_tables: torch.Tensor, query_starts: torch.Tensor,
                     context_lens: torch.Tensor, tiles: torch.Tensor, scale: float, out: torch.Tensor) -> None:
    """Prefill, prompt chunks after a cached prefix, and decode rows, in one launch.
    q, out: [T, H, D]; kv: [2, blocks, page, Hkv, D]; block_tables [S, max_blocks] int32;
    query_starts [S + 1], context_lens [S] int32; tiles [2, num_tiles] int32 (extend_tiles)."""
    t, h, d = q.shape
    hkv, page = kv.shape[3], kv.shape[2]
    if t == 0 or tiles.shape[1] == 0:
        return
    _extend_attention_kernel[(tiles.shape[1], h)](
        q, kv[0], kv[1], out, block_tables, query_starts, context_lens, tiles[0], tiles[1], scale * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0), hkv, GROUP=h // hkv, D=d,
        PAGE=page, BLOCK_D=_pow2(d), BLOCK_M=EXTEND_BLOCK_M, BLOCK_N=64, PREC=_dot_precision(q.dtype), num_warps=4,
        num_stages=2, **launch_options())


def decode_splits(num_streams: int, num_kv_heads: int, max_context: int, num_sms: int, block_n: int = 64) -> int:
    """Splits of the context so that the decode grid fills the GPU about twice over, no more
    than there are key tiles."""
    want = triton.cdiv(2 * num_sms, max(1, num_streams * num_kv_heads))
    tiles = triton.cdiv(max(1, max_context), block_n)
    return max(1, min(triton.next_power_of_2(want), triton.next_power_of_2(tiles), 64))


class DecodeWorkspace:
    """Partial outputs of split decode and the per-(stream, KV head) split counters,
    preallocated for up to max_streams (graph-safe; every launch leaves the counters at 0)."""

    def __init__(self, max_streams: int, num_heads: int, head_dim: int, max_splits: int, device):
        self.o_part = torch.empty(max_streams * num_heads * max_splits * head_dim, dtype=torch.float32, device=device)
        self.lse = torch.empty(max_streams * num_heads * max_splits, dtype=torch.float32, device=device)
        self.counters = torch.zeros(max_streams * num_heads, dtype=torch.int32, device=device)


def decode_attention(q: torch.Tensor, kv: torch.Tensor, block_tables: torch.Tensor, query_starts: torch.Tensor,
                     context_lens: torch.Tensor, scale: float, num_splits: int, ws: DecodeWorkspace,
                     out: torch.Tensor) -> None:
    """One query token per stream (row query_starts[s]); context_lens [S] may hold 0 for
    padding streams (their output is zeros). q, out: [T, H, D]."""
    t, h, d = q.shape
    hkv, page = kv.shape[3], kv.shape[2]
    n_streams = context_lens.shape[0]
    if n_streams == 0:
        return
    group = h // hkv
    group_p2 = triton.next_power_of_2(group)
    split_tile = max(1, min(triton.next_power_of_2(num_splits), 4096 // (group_p2 * _pow2(d))))
    _decode_split_kernel[(n_streams, hkv, num_splits)](
        q, kv[0], kv[1], ws.o_part, ws.lse, ws.counters, out, block_tables, query_starts, context_lens,
        scale * _LOG2E, q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0), hkv,
        GROUP=group, D=d, PAGE=page, BLOCK_D=_pow2(d), BLOCK_G=_pow2(group), BLOCK_N=64, NUM_SPLITS=num_splits,
        GROUP_P2=group_p2, SPLIT_TILE=split_tile, PREC=_dot_precision(q.dtype), num_warps=4, num_stages=2,
        **launch_options())
