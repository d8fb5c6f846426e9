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
decode rows and short chunks.

Long prompt chunks take the expanded form (mla_prefill), as transformers computes them: the
context's latents gathered and multiplied by kv_b_proj once a step ([N, kvr] x [kvr, H (dn + dv)]),
then causal flash attention over 64-row query tiles with K = [k_nope | k_pe] (dn + dr wide) and
V (dv wide). A score costs dn + dr + dv multiply-adds instead of the absorbed form's 2 kvr + dr,
and a tile of 64 query rows shares each key tile instead of one row reading it alone. Its sizes
come from the host (the gather), so it runs in eager steps only (more tokens than the graphs
hold, graph_runner.MAX_GRAPH_TOKENS, or too many decode rows beside the prompts): for a shorter
prompt the graph's saved launches are worth more than the form (docs/benchmarks.md, MLA).

No host sync: each program finds its row's stream on the device, so the step is captured in
CUDA graphs. Padding rows (past every stream's, or of a context of 0) write zeros."""

from typing import Optional, Tuple

import numpy as np
import torch
import triton
import triton.language as tl

from rtp_llm.device.cuda.kernels.attention import _LOG2E, EXTEND_BLOCK_M, _dot_precision, _merge_splits, _pow2
from rtp_llm.device.cuda.kernels.attention import decode_splits as attention_decode_splits

# A step with this many prompt rows (query rows of streams with more than one) or more runs its
# prompt rows in the expanded form; below it every row takes the absorbed kernel.
EXPAND_MIN_ROWS = 256


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
def _mla_kernel(q_ptr, cache_ptr, bt_ptr, qs_ptr, ctx_ptr, out_ptr, rows_ptr, o_part_ptr, lse_part_ptr, S, H,
                scale_log2, stride_qt, stride_qh, stride_bt, stride_ot, stride_oh, KVR: tl.constexpr,
                DR: tl.constexpr, KVR_P: tl.constexpr, DR_P: tl.constexpr, PAGE: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, NUM_SPLITS: tl.constexpr,
                PREC: tl.constexpr):
    """o_lat of one row for heads [program_id(1) BLOCK_H, +BLOCK_H): q [T, H, KVR + DR] (q_lat |
    q_pe), the cache [blocks, PAGE, KVR + DR], out [R, H, KVR]. The program's row t: program_id(0),
    or rows[program_id(0)] with ROWS (its output at program_id(0) then). The row's stream: the
    last s with query_starts[s] <= t (binary search); it attends its position + 1 context tokens.
    With NUM_SPLITS > 1 the program takes split program_id(2) of them and writes its partial
    output and base-2 log-sum-exp (o_part [R, H, NUM_SPLITS, KVR], lse [R, H, NUM_SPLITS]; an
    empty split: zeros, -inf) for _mla_merge_kernel."""
    if ROWS:
        t = tl.load(rows_ptr + tl.program_id(0))
    else:
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
    q_row = q_ptr + tl.program_id(0).to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh
    q_lat = tl.load(q_row + offs_c[None, :], mask=hmask[:, None] & cmask[None, :], other=0.0)   # [BH, KVR_P]
    q_pe = tl.load(q_row + KVR + offs_r[None, :], mask=hmask[:, None] & rmask[None, :], other=0.0)  # [BH, DR_P]
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, KVR_P], tl.float32)
    table = bt_ptr + stream.to(tl.int64) * stride_bt
    W: tl.constexpr = KVR + DR
    chunk = tl.cdiv(tl.cdiv(limit, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo_j = tl.program_id(2) * chunk
    hi_j = tl.minimum(limit, lo_j + chunk)
    for start in range(lo_j, hi_j, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        jm = j < hi_j
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
    out = acc / tl.maximum(l_i, 1e-30)[:, None]  # (a row or split of no context: l_i 0, acc 0 -> zeros)
    r = tl.program_id(0).to(tl.int64)
    if NUM_SPLITS == 1:
        o_row = out_ptr + r * stride_ot + offs_h[:, None] * stride_oh
        tl.store(o_row + offs_c[None, :], out.to(out_ptr.dtype.element_ty), mask=hmask[:, None] & cmask[None, :])
    else:
        part = (r * H + offs_h) * NUM_SPLITS + tl.program_id(2)                          # [BH]
        tl.store(o_part_ptr + part[:, None] * KVR + offs_c[None, :], out, mask=hmask[:, None] & cmask[None, :])
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
        tl.store(lse_part_ptr + part, lse, mask=hmask)


@triton.jit
def _mla_merge_kernel(o_part_ptr, lse_part_ptr, out_ptr, H, stride_ot, stride_oh, KVR: tl.constexpr,
                      KVR_P: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLIT_TILE: tl.constexpr):
    """out[r, h] = the lse-weighted mean of row r's head h's NUM_SPLITS partials (empty ones
    weigh 0): one program a (row, head)."""
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    _merge_splits(o_part_ptr, lse_part_ptr, out_ptr, r, stride_ot, stride_oh, r * H + h, h, NUM_SPLITS, 1, KVR,
                  KVR_P, NUM_SPLITS, 1, SPLIT_TILE)


def _block_h(h: int, kvr: int) -> int:
    # Wide latents (DeepSeek's 512) keep a [BLOCK_H, kvr] fp32 accumulator a program: 32 heads at
    # most there (64 KiB of registers over 8 warps), 64 for narrow ones.
    return max(16, min(32 if kvr > 256 else 64, triton.next_power_of_2(h)))


def decode_splits(num_streams: int, num_heads: int, max_context: int, num_sms: int) -> int:
    """Context splits of a decode step's rows (mla_attention's `splits`): the grid of rows x head
    blocks x splits fills the GPU about twice over (DeepSeek-V2-Lite at batch 1: one head block
    a row, so without splits one program reads the whole context alone)."""
    return attention_decode_splits(num_streams, triton.cdiv(num_heads, 32), max_context, num_sms, block_n=32)


def mla_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor,
                  query_starts: torch.Tensor, context_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor,
                  scale: float, rows: Optional[torch.Tensor] = None, splits: int = 1, ws=None) -> torch.Tensor:
    """q_nope [T, H, dn], q_pe [T, H, dr] (rotated); cache [blocks, block_size, kvr + dr] (this
    step's rows written); block_tables [S, max_blocks], query_starts [S + 1], context_lens [S]
    (int32); w_uk [H, dn, kvr], w_uv [H, kvr, dv]. Returns [T, H, dv] in q's dtype, or with
    rows ([R] int32, a subset of the step's rows) [R, H, dv] for those rows. splits > 1: each
    row's context in that many parts, merged after; ws: an attention.DecodeWorkspace of at least
    R x H x splits x kvr partials."""
    if rows is not None:
        rl = rows.long()
        q_nope, q_pe = q_nope.index_select(0, rl), q_pe.index_select(0, rl)
    t, h, _ = q_nope.shape
    dr, kvr = q_pe.shape[2], w_uk.shape[2]
    q = torch.cat([torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1), q_pe], dim=-1).contiguous()  # [R, H, W]
    o_lat = torch.empty(t, h, kvr, dtype=q.dtype, device=q.device)
    if t:
        block_h = _block_h(h, kvr)
        o_part, lse = (ws.o_part, ws.lse) if splits > 1 else (o_lat, o_lat)
        _mla_kernel[(t, triton.cdiv(h, block_h), splits)](
            q, cache, block_tables, query_starts, context_lens, o_lat, rows if rows is not None else query_starts,
            o_part, lse, context_lens.shape[0], h, scale * _LOG2E, q.stride(0), q.stride(1),
            block_tables.stride(0), o_lat.stride(0), o_lat.stride(1), KVR=kvr, DR=dr, KVR_P=_pow2(kvr),
            DR_P=_pow2(dr), PAGE=cache.shape[1], BLOCK_H=block_h, BLOCK_N=32 if kvr > 256 else 64,
            ROWS=rows is not None, NUM_SPLITS=splits, PREC=_dot_precision(q.dtype),
            num_warps=4 if kvr <= 256 else 8, num_stages=2)
        if splits > 1:
            _mla_merge_kernel[(t, h)](o_part, lse, o_lat, h, o_lat.stride(0), o_lat.stride(1), KVR=kvr,
                                      KVR_P=_pow2(kvr), NUM_SPLITS=splits,
                                      SPLIT_TILE=max(1, min(triton.next_power_of_2(splits), 4096 // _pow2(kvr))))
    return torch.bmm(o_lat.transpose(0, 1), w_uv).transpose(0, 1)


def expands(query_lens: np.ndarray) -> bool:
    """Whether a step's prompt rows take the expanded form (mla_prefill): EXPAND_MIN_ROWS or more
    query rows of streams with more than one."""
    return int(query_lens[query_lens > 1].sum()) >= EXPAND_MIN_ROWS


def context_slots(prompt: np.ndarray, context_lens: np.ndarray, block_tables: np.ndarray,
                  block_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """mla_prefill's gather, on the host: (slots [N], starts [S]) int32, the cache slots of the
    whole context of every stream s with prompt[s], stream after stream, and where each one's
    begin (0 for the others). block_tables [S, max_blocks]."""
    lens = np.where(prompt, context_lens, 0).astype(np.int64)
    starts = np.cumsum(lens) - lens
    stream = np.repeat(np.arange(len(lens)), lens)
    j = np.arange(int(lens.sum())) - np.repeat(starts, lens)
    slots = block_tables[stream, j // block_size].astype(np.int64) * block_size + j % block_size
    return slots.astype(np.int32), np.where(prompt, starts, 0).astype(np.int32)


@triton.jit
def _mla_prefill_kernel(qn_ptr, qp_ptr, kv_ptr, ctx_ptr, out_ptr, kstart_ptr, qs_ptr, ctx_lens_ptr, tile_s_ptr,
                        tile_r_ptr, scale_log2, stride_qnt, stride_qnh, stride_qpt, stride_qph, stride_kvn,
                        stride_kvh, stride_cn, stride_ot, stride_oh, KVR, DN: tl.constexpr, DR: tl.constexpr,
                        DV: tl.constexpr, DN_P: tl.constexpr, DR_P: tl.constexpr, DV_P: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    """One head of one tile of BLOCK_M query rows of a stream (tiles: stream, first row; stream
    < 0: none). The stream's context is rows [kstart, kstart + ctx) of kv [N, H, DN + DV] (k_nope
    | v, expanded) and of ctx [N, KVR + DR] (gathered cache rows: k_pe at KVR); its query rows
    are its last qlen positions, each attending keys up to its own position."""
    s = tl.load(tile_s_ptr + tl.program_id(0))
    if s < 0:
        return
    h = tl.program_id(1)
    first = tl.load(tile_r_ptr + tl.program_id(0))
    q0 = tl.load(qs_ptr + s)
    qlen = tl.load(qs_ptr + s + 1) - q0
    ctx = tl.load(ctx_lens_ptr + s)
    kb = tl.load(kstart_ptr + s).to(tl.int64)
    offs_m = first + tl.arange(0, BLOCK_M)
    mmask = offs_m < qlen
    pos = ctx - qlen + offs_m                                   # [BM] each row's position
    rows = (q0 + offs_m).to(tl.int64)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_dn, offs_dr, offs_dv = tl.arange(0, DN_P), tl.arange(0, DR_P), tl.arange(0, DV_P)
    dnm, drm, dvm = offs_dn < DN, offs_dr < DR, offs_dv < DV
    qn = tl.load(qn_ptr + rows[:, None] * stride_qnt + h * stride_qnh + offs_dn[None, :],
                 mask=mmask[:, None] & dnm[None, :], other=0.0)                          # [BM, DN_P]
    qp = tl.load(qp_ptr + rows[:, None] * stride_qpt + h * stride_qph + offs_dr[None, :],
                 mask=mmask[:, None] & drm[None, :], other=0.0)                          # [BM, DR_P]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_P], tl.float32)
    end = tl.minimum(ctx, ctx - qlen + first + BLOCK_M)       # past the tile's last row's position
    for n0 in range(0, end, BLOCK_N):
        j = n0 + offs_n0
        jm = j < end
        kv_row = kv_ptr + (kb + j)[:, None] * stride_kvn + h * stride_kvh
        kn = tl.load(kv_row + offs_dn[None, :], mask=jm[:, None] & dnm[None, :], other=0.0)       # [BN, DN_P]
        kp = tl.load(ctx_ptr + (kb + j)[:, None] * stride_cn + KVR + offs_dr[None, :],
                     mask=jm[:, None] & drm[None, :], other=0.0)                                  # [BN, DR_P]
        sc = tl.dot(qn, tl.trans(kn), input_precision=PREC)
        sc = tl.dot(qp, tl.trans(kp), sc, input_precision=PREC) * scale_log2
        sc = tl.where((j[None, :] <= pos[:, None]) & jm[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))  # finite: key 0 is in every row's first tile
        p = tl.exp2(sc - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(kv_row + DN + offs_dv[None, :], mask=jm[:, None] & dvm[None, :], other=0.0)      # [BN, DV_P]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_dv[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & dvm[None, :])


def mla_prefill(q_nope: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor, ctx_slots: torch.Tensor,
                ctx_starts: torch.Tensor, query_starts: torch.Tensor, context_lens: torch.Tensor,
                tiles: torch.Tensor, kv_b: torch.Tensor, scale: float, out: torch.Tensor) -> None:
    """The expanded form for the query rows of `tiles` (extend_tiles of the prompt streams):
    q_nope [T, H, dn], q_pe [T, H, dr] (rotated); cache [blocks, block_size, kvr + dr] (this step's
    rows written); ctx_slots [N] int32, the cache slots of every tiled stream's whole context,
    stream after stream, each from ctx_starts [S] (int32); kv_b [kvr, H (dn + dv)] (kv_b_proj,
    transposed). Writes out [T, H, dv] at the tiles' rows."""
    t, h, dn = q_nope.shape
    dr, kvr = q_pe.shape[2], kv_b.shape[0]
    dv = kv_b.shape[1] // h - dn
    if t == 0 or tiles.shape[1] == 0:
        return
    ctx = cache.view(-1, cache.shape[-1]).index_select(0, ctx_slots.long())              # [N, kvr + dr]
    kv = torch.mm(ctx[:, :kvr], kv_b).view(-1, h, dn + dv)                               # [N, H, dn + dv]
    _mla_prefill_kernel[(tiles.shape[1], h)](
        q_nope, q_pe, kv, ctx, out, ctx_starts, query_starts, context_lens, tiles[0], tiles[1], scale * _LOG2E,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), kv.stride(0), kv.stride(1),
        ctx.stride(0), out.stride(0), out.stride(1), kvr, DN=dn, DR=dr, DV=dv, DN_P=_pow2(dn), DR_P=_pow2(dr),
        DV_P=_pow2(dv), BLOCK_M=EXTEND_BLOCK_M, BLOCK_N=64, PREC=_dot_precision(q_nope.dtype), num_warps=4,
        num_stages=2)
