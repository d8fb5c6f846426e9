"""Row-wise Triton kernels of the CUDA backend: RMSNorm with the fused residual add, rotary
(with Qwen3's optional per-head q/k norm and the KV write fused in), SiLU-and-mul, the KV cache
write, the placeholder tokens of overlapped steps and grammars' token bitmask. Shapes: T tokens, H query heads, Hkv KV
heads, D head_dim; the KV cache of one layer is [2, blocks, page, Hkv, D].

Rounding follows HF transformers in the model dtype (e.g. RMSNorm normalizes in fp32, casts,
then scales; rotary rounds each product) so that greedy tokens match HF's, not just nearly."""

import torch
import triton
import triton.language as tl

from rtp_llm.device.cuda.kernels.launch import launch_options, pdl_enter


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
def _cached(x, cache_ptr):
    """A key or value as the cache stores it: in an FP8 (e4m3) cache rounded to nearest and
    saturated at +-448 (scale 1, as vLLM's fp8 cache without checkpoint scales), else as it is."""
    if cache_ptr.dtype.element_ty == tl.float8e4nv:
        x = tl.clamp(x.to(tl.float32), -448.0, 448.0)
    return x.to(cache_ptr.dtype.element_ty)


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
        tl.store(kc_ptr + dst, _cached(k1, kc_ptr), mask=m)
        tl.store(kc_ptr + dst + HALF, _cached(k2, kc_ptr), mask=m)
        vsrc = row + (H + HKV) * D + hs[:, None] * D + ds[None, :]
        tl.store(vc_ptr + dst, _cached(tl.load(vsrc, mask=m), vc_ptr), mask=m)
        tl.store(vc_ptr + dst + HALF, _cached(tl.load(vsrc + HALF, mask=m), vc_ptr), mask=m)


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


# ---------------------------------------------------------------- grammar token bitmask


@triton.jit(do_not_specialize=["vocab", "words"])
def _token_bitmask_kernel(logits_ptr, rows_ptr, bits_ptr, vocab, words, stride_l, BLOCK: tl.constexpr,
                          PDL: tl.constexpr):
    pdl_enter(PDL)
    g = tl.program_id(0)
    row = tl.load(rows_ptr + g).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < vocab
    w = tl.load(bits_ptr + g.to(tl.int64) * words + offs // 32, mask=m, other=-1)
    banned = ((w >> (offs % 32)) & 1) == 0
    tl.store(logits_ptr + row * stride_l + offs, float("-inf"), mask=m & banned)


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bits: torch.Tensor) -> None:
    """In place, one launch: logits [N, V] fp32; row rows[g] ([G] int64) keeps the tokens whose
    bit is set in bits[g] ([G, ceil(V/32)] int32, xgrammar's layout), the others become -inf.
    Only the banned entries are written (the allowed ones are not even read)."""
    g, vocab = rows.numel(), logits.shape[1]
    if g:
        block = 4096
        _token_bitmask_kernel[(g, triton.cdiv(vocab, block))](logits, rows, bits, vocab, bits.shape[1],
                                                              logits.stride(0), BLOCK=block, **launch_options())


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
    tl.store(kc_ptr + dst, _cached(k, kc_ptr), mask=m)
    tl.store(vc_ptr + dst, _cached(v, vc_ptr), mask=m)


def store_kv(k: torch.Tensor, v: torch.Tensor, kv: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k, v: [T, Hkv, D] -> kv: [2, blocks, page, Hkv, D] at slot_mapping [T] (< 0: skipped)."""
    t, hkv, d = k.shape
    if t == 0:
        return
    _store_kv_kernel[(t,)](k, v, kv[0], kv[1], slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1), hkv,
                           D=d, BLOCK_H=triton.next_power_of_2(hkv), BLOCK_D=triton.next_power_of_2(d),
                           **launch_options())
