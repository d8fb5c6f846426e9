"""Multi-head latent attention (DeepSeek-V2/V3) over the paged latent cache, for every row of a
step (decode, prompt chunks and mixed steps alike), in the absorbed form: kv_b_proj's key half
goes into the query and its value half comes after the attention, so the kernel reads only the
cache as stored, one row per token: [latent (kvr) | rope key (dr)], W = kvr + dr wide.

    q_lat[t, h] = q_nope[t, h] w_uk[h]              [T, H, kvr]   (torch bmm)
    score(t, h, j) = q_lat[t, h] . latent_j + q_pe[t, h] . k_pe_j, j <= the row's position
    o_lat[t, h] = softmax_j(score * scale) @ latent  [T, H, kvr]   (_mla_kernel)
    out[t, h] = o_lat[t, h] w_uv[h]                  [T, H, dv]    (torch bmm)

A program takes one row and BLOCK_H heads (the latent is shared by every head: MQA), and
walks the row's context in BLOCK_N-token pages of the block table with an online softmax.
Rows of a prompt chunk each read their own context: right for any step, the cheaper form for
decode rows (the expanded K/V form is cheaper for long prompts: a later kernel).

No host sync: each program finds its row's stream on the device, so the step is captured in
CUDA graphs. Padding rows (past every stream's, or of a context of 0) write zeros."""

import torch
import triton
import triton.language as tl

from rtp_llm.device.cuda.kernels.attention import _LOG2E, _dot_precision, _pow2


@triton.jit
def _store_latent_kernel(entry_ptr, cache_ptr, slot_ptr, W, stride_e, BLOCK_W: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    if slot < 0:
        return
    offs = tl.arange(0, BLOCK_W)
    m = offs < W
    tl.store(cache_ptr + slot.to(tl.int64) * W + offs, tl.load(entry_ptr + t * stride_e + offs, mask=m), mask=m)


def store_latent(entry: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """entry [T, W] into cache [blocks, block_size, W] at slot_mapping [T] (< 0: not written)."""
    t, w = entry.shape
    assert cache.shape[-1] == w and cache.is_contiguous() and entry.stride(1) == 1
    if t:
        _store_latent_kernel[(t,)](entry, cache, slot_mapping, w, entry.stride(0), BLOCK_W=triton.next_power_of_2(w))


@triton.jit
def _mla_kernel(q_ptr, cache_ptr, bt_ptr, qs_ptr, ctx_ptr, out_ptr, S, H, scale_log2, stride_qt, stride_qh,
                stride_bt, stride_ot, stride_oh, KVR: tl.constexpr, DR: tl.constexpr, KVR_P: tl.constexpr,
                DR_P: tl.constexpr, PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                PREC: tl.constexpr):
    """o_lat of one row for heads [program_id(1) BLOCK_H, +BLOCK_H): q [T, H, KVR + DR] (q_lat |
    q_pe), the cache [blocks, PAGE, KVR + DR], out [T, H, KVR]. The row's stream: the last s
    with query_starts[s] <= t (binary search); it attends its position + 1 context tokens."""
    t = tl.program_id(0)
    lo = 0
    hi = S
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(qs_ptr + mid + 1) <= t:
            lo = mid + 1
        else:
            hi = mid
    stream = tl.minimum(lo, S - 1)
    limit = tl.load(ctx_ptr + stream) - (tl.load(qs_ptr + stream + 1) - t) + 1
    limit = tl.where(lo < S, limit, 0)  # (a padding row past every stream's)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = offs_h < H
    offs_c = tl.arange(0, KVR_P)
    offs_r = tl.arange(0, DR_P)
    cmask, rmask = offs_c < KVR, offs_r < DR
    q_row = q_ptr + t.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh
    q_lat = tl.load(q_row + offs_c[None, :], mask=hmask[:, None] & cmask[None, :], other=0.0)   # [BH, KVR_P]
    q_pe = tl.load(q_row + KVR + offs_r[None, :], mask=hmask[:, None] & rmask[None, :], other=0.0)  # [BH, DR_P]
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, KVR_P], tl.float32)
    table = bt_ptr + stream.to(tl.int64) * stride_bt
    W: tl.constexpr = KVR + DR
    for start in range(0, limit, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        jm = j < limit
        slot = tl.load(table + j // PAGE, mask=jm, other=0).to(tl.int64) * PAGE + j % PAGE
        lat = tl.load(cache_ptr + slot[:, None] * W + offs_c[None, :], mask=jm[:, None] & cmask[None, :], other=0.0)
        kpe = tl.load(cache_ptr + slot[:, None] * W + KVR + offs_r[None, :], mask=jm[:, None] & rmask[None, :],
                      other=0.0)
        s = tl.dot(q_lat, tl.trans(lat), input_precision=PREC)
        s = tl.dot(q_pe, tl.trans(kpe), s, input_precision=PREC) * scale_log2
        s = tl.where(jm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(lat.dtype), lat, input_precision=PREC)
        m_i = m_new
    out = acc / tl.maximum(l_i, 1e-30)[:, None]  # (a row of no context: l_i 0, acc 0 -> zeros)
    o_row = out_ptr + t.to(tl.int64) * stride_ot + offs_h[:, None] * stride_oh
    tl.store(o_row + offs_c[None, :], out.to(out_ptr.dtype.element_ty), mask=hmask[:, None] & cmask[None, :])


def mla_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor,
                  query_starts: torch.Tensor, context_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """q_nope [T, H, dn], q_pe [T, H, dr] (rotated); cache [blocks, block_size, kvr + dr] (this
    step's rows written); block_tables [S, max_blocks], query_starts [S + 1], context_lens [S]
    (int32); w_uk [H, dn, kvr], w_uv [H, kvr, dv]. Returns [T, H, dv] in q's dtype."""
    t, h, _ = q_nope.shape
    dr, kvr = q_pe.shape[2], w_uk.shape[2]
    q = torch.cat([torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1), q_pe], dim=-1).contiguous()  # [T, H, W]
    o_lat = torch.empty(t, h, kvr, dtype=q.dtype, device=q.device)
    if t:
        # Wide latents (DeepSeek's 512) keep a [BLOCK_H, kvr] fp32 accumulator a program: 32 heads
        # at most there (64 KiB of registers over 8 warps), 64 for narrow ones.
        block_h = max(16, min(32 if kvr > 256 else 64, triton.next_power_of_2(h)))
        block_n = 32 if kvr > 256 else 64
        _mla_kernel[(t, triton.cdiv(h, block_h))](
            q, cache, block_tables, query_starts, context_lens, o_lat, context_lens.shape[0], h, scale * _LOG2E,
            q.stride(0), q.stride(1), block_tables.stride(0), o_lat.stride(0), o_lat.stride(1), KVR=kvr, DR=dr,
            KVR_P=_pow2(kvr), DR_P=_pow2(dr),
            PAGE=cache.shape[1], BLOCK_H=block_h, BLOCK_N=block_n, PREC=_dot_precision(q.dtype),
            num_warps=4 if kvr <= 256 else 8, num_stages=2)
    return torch.bmm(o_lat.transpose(0, 1), w_uv).transpose(0, 1)
