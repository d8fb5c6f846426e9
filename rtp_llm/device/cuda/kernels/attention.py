"""Attention over the paged KV cache: the extend kernel (prefill, prompt chunks after a cached
prefix, mixed batches) over a tile table, and the split-context decode kernel. Shapes: T tokens
in the step, S streams, H query heads, Hkv KV heads (G = H / Hkv per group), D head_dim. KV
cache of one layer: K and V each [num_blocks, page, Hkv, D] contiguous, so token slot s of head
h starts at (s * Hkv + h) * D."""

import numpy as np
import torch
import triton
import triton.language as tl

from rtp_llm.device.cuda.kernels.launch import launch_options, pdl_enter

_LOG2E = 1.4426950408889634


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(int(n)))


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 runs are the parity reference: no TF32 (torch's matmul default on CUDA is also off).
    return "ieee" if dtype == torch.float32 else "tf32"


# ---------------------------------------------------------------- attention over the paged cache


@triton.jit
def _load_kv_tile(cache_ptr, block_tables_ptr, offs_n, nmask, kvh, HKV, D: tl.constexpr, PAGE: tl.constexpr,
                  offs_d, dmask, DT: tl.constexpr):
    """Keys or values [BLOCK_N, BLOCK_D] of positions offs_n in dtype DT (the queries'; an FP8
    cache's e4m3 values widen exactly)."""
    page = tl.load(block_tables_ptr + offs_n // PAGE, mask=nmask, other=0).to(tl.int64)
    slot = page * PAGE + offs_n % PAGE
    return tl.load(cache_ptr + (slot[:, None] * HKV + kvh) * D + offs_d[None, :],
                   mask=nmask[:, None] & dmask[None, :], other=0.0).to(DT)


@triton.jit
def _online_softmax_step(qk, m_i, l_i, acc, vc_ptr, bt, offs_n, nmask, kvh, HKV, D: tl.constexpr, PAGE: tl.constexpr,
                         offs_d, dmask, PREC: tl.constexpr, DT: tl.constexpr):
    """Folds one key tile into a flash-attention state: qk [M, N] the tile's base-2 scores
    (masked keys -inf), m_i / l_i [M] the running max and sum of exp2, acc [M, BLOCK_D] the
    running output (fp32); the tile's values are loaded here. Returns the new (m_i, l_i, acc).
    m_i must be finite after the first tile (some key of it visible to every row)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.exp2(qk - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load_kv_tile(vc_ptr, bt, offs_n, nmask, kvh, HKV, D, PAGE, offs_d, dmask, DT)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


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
        k = _load_kv_tile(kc_ptr, bt, offs_n, nmask, kvh, HKV, D, PAGE, offs_d, dmask, q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
        qk = tl.where((offs_n[None, :] <= pos[:, None]) & nmask[None, :], qk, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(qk, m_i, l_i, acc, vc_ptr, bt, offs_n, nmask, kvh, HKV, D, PAGE,
                                             offs_d, dmask, PREC, q.dtype)
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
        k = _load_kv_tile(kc_ptr, bt, offs_n, nmask, kvh, HKV, D, PAGE, offs_d, dmask, q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
        qk = tl.where(nmask[None, :], qk, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(qk, m_i, l_i, acc, vc_ptr, bt, offs_n, nmask, kvh, HKV, D, PAGE,
                                             offs_d, dmask, PREC, q.dtype)
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
    preallocated for up to max_batch_size (graph-safe; every launch leaves the counters at 0)."""

    def __init__(self, max_batch_size: int, num_heads: int, head_dim: int, max_splits: int, device):
        self.o_part = torch.empty(max_batch_size * num_heads * max_splits * head_dim, dtype=torch.float32,
                                  device=device)
        self.lse = torch.empty(max_batch_size * num_heads * max_splits, dtype=torch.float32, device=device)
        self.counters = torch.zeros(max_batch_size * num_heads, dtype=torch.int32, device=device)


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
