"""Multi-head latent attention (DeepSeek-V2/V3) on the CPU, in torch ops over the paged latent
cache [blocks, block_size, W], W = kvr + dr (each token's latent, then its rope key).

Decode rows (query length 1: CpuBackend keeps MLA's prompt chunks off the paged path) absorb
kv_b_proj's up-projections and read only the latent: a query q = [q_nope w_uk, q_pe] of width W
scores the cache rows as they are stored (one GEMM per group of streams, the rope key included),
the probabilities weight the latents, and w_uv maps each head's weighted latent to its value
space. Prompt chunks expand K and V from the context's latents (kv_b_proj, as transformers
does) and run SDPA: their query count makes the expanded form the cheaper one.
Shapes: T rows, S decode streams, H heads (this rank's), dn / dr / dv the no-rope, rope and value
head dims, kvr the latent rank, L a group's longest context."""

from typing import Iterator, List, Tuple

import torch
import torch.nn.functional as F

# Rows (streams x context positions) gathered at once by a decode group: bounds the transient
# [g, L, W] copy of the latents (about 64 MiB at W 576 in fp32) however long the contexts.
_GATHER_ROWS = 1 << 15

GatherGroup = Tuple[int, int, torch.Tensor, torch.Tensor]  # (s0, s1, slots [g, L], valid [g, L])


def write_latent(entry: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """entry [T, W] into cache [blocks, block_size, W] at slot_mapping [T]."""
    cache.view(-1, cache.shape[-1]).index_copy_(0, slot_mapping.long(), entry.to(cache.dtype))


def _groups(lens: torch.Tensor) -> Iterator[Tuple[int, int]]:
    """Consecutive stream ranges [s0, s1) whose padded gather fits _GATHER_ROWS (at least one)."""
    s0, longest = 0, 0
    for s, n in enumerate(lens.tolist()):
        if s > s0 and (s + 1 - s0) * max(longest, n) > _GATHER_ROWS:
            yield s0, s
            s0, longest = s, 0
        longest = max(longest, n)
    yield s0, len(lens)


def decode_plan(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> List[GatherGroup]:
    """Where each decode stream's context lives, per group of streams (_groups): (s0, s1, slots
    [g, L] int64, valid [g, L] bool), L the group's longest context; the padding positions' slots
    are 0 (read, then masked). The same for every layer of a step: built once (CpuAttentionMetadata)."""
    lens = context_lens.long()
    plan = []
    for s0, s1 in _groups(lens):
        g_lens = lens[s0:s1]
        j = torch.arange(int(g_lens.max()))
        valid = j[None, :] < g_lens[:, None]
        slots = block_tables[s0:s1, j // block_size].long() * block_size + j % block_size
        plan.append((s0, s1, torch.where(valid, slots, torch.zeros_like(slots)), valid))
    return plan


def decode(q_nope: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor, plan: List[GatherGroup],
           w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    """One query row per stream: q_nope [S, H, dn], q_pe [S, H, dr]; plan from decode_plan (each
    row's context includes the row itself, already cached). Returns [S, H, dv]."""
    S, H, _ = q_nope.shape
    W, kvr = cache.shape[-1], w_uk.shape[2]
    # fp32 inside whatever the run dtype: torch's CPU batched GEMMs of a few rows (H per stream)
    # run several times slower in bf16 than in fp32, and fp32 accumulates as the paged kernel does.
    f32 = torch.float32
    q = torch.cat([torch.matmul(q_nope.transpose(0, 1).to(f32), w_uk.to(f32)).transpose(0, 1),
                   q_pe.to(f32)], dim=-1)                                                # [S, H, W]
    flat = cache.view(-1, W)
    o_lat = q.new_empty(S, H, kvr)
    for s0, s1, slots, valid in plan:
        ctx = flat[slots].to(f32)                                                        # [g, L, W]
        scores = torch.matmul(q[s0:s1], ctx.transpose(1, 2)) * scale                     # [g, H, L]
        scores.masked_fill_(~valid[:, None, :], float("-inf"))
        o_lat[s0:s1] = torch.matmul(torch.softmax(scores, dim=-1), ctx[..., :kvr])       # [g, H, kvr]
    out = torch.matmul(o_lat.transpose(0, 1), w_uv.to(f32)).transpose(0, 1)              # [S, H, dv]
    return out.to(q_nope.dtype)


def prefill(q_nope: torch.Tensor, q_pe: torch.Tensor, ctx: torch.Tensor, kv_b: torch.Tensor, scale: float) -> torch.Tensor:
    """One stream's chunk of n rows, the last n of its context ctx [c, W] (latents as cached):
    K = [latent kv_b's key half, k_pe for every head], V = latent kv_b's value half; causal.
    q_nope [n, H, dn], q_pe [n, H, dr]; kv_b [kvr, H (dn + dv)]. Returns [n, H, dv]."""
    n, H, dn = q_nope.shape
    c, dr = ctx.shape[0], q_pe.shape[2]
    kvr = kv_b.shape[0]
    kv = torch.matmul(ctx[:, :kvr], kv_b).view(c, H, -1)                                # [c, H, dn + dv]
    k = torch.cat([kv[..., :dn], ctx[:, None, kvr:].expand(c, H, dr)], dim=-1)          # [c, H, dn + dr]
    v = kv[..., dn:]
    q = torch.cat([q_nope, q_pe], dim=-1)                                                # [n, H, dn + dr]
    mask = None if c == n else torch.arange(c)[None, :] <= torch.arange(c - n, c)[:, None]
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       attn_mask=mask, is_causal=mask is None, scale=scale)
    return o[0].transpose(0, 1)


def mla_attention(q_nope, q_pe, entry, cache, meta, w_uk, w_uv, kv_b, scale) -> torch.Tensor:
    """DeviceBackend.mla_attention over CpuAttentionMetadata: its paged rows are the decode rows,
    its chunks the prompt chunks (first row, rows, the context's slots or None: the chunk is
    the whole context, its latents this step's entry rows)."""
    T, H, _ = q_nope.shape
    rows = meta.paged_rows
    if meta.mla_plan is None and (rows is None or len(rows)):
        meta.mla_plan = decode_plan(meta.block_tables, meta.context_lens, cache.shape[1])
    if rows is None:  # every row decodes
        return decode(q_nope, q_pe, cache, meta.mla_plan, w_uk, w_uv, scale)
    out = q_nope.new_empty(T, H, w_uv.shape[2])
    if len(rows):
        out[rows] = decode(q_nope[rows], q_pe[rows], cache, meta.mla_plan, w_uk, w_uv, scale)
    flat = cache.view(-1, cache.shape[-1])
    for start, n, slots in meta.chunks:
        ctx = entry[start:start + n] if slots is None else flat[slots]
        out[start:start + n] = prefill(q_nope[start:start + n], q_pe[start:start + n], ctx, kv_b, scale)
    return out
