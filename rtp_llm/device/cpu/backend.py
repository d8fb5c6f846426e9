"""CPU backend: paged attention composed from batched torch ops (one gather and one SDPA per
layer for all decode streams; one SDPA per prefill chunk), RMSNorm in the compute-ops
extension."""

import os
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch
import torch.nn.functional as F

from rtp_llm.device.base import AttentionMetadata, DeviceBackend


@dataclass
class CpuAttentionMetadata(AttentionMetadata):
    slot_mapping: torch.Tensor  # [T] int64
    # Decode streams (one query token each), batched: rows of the token batch, their KV slots
    # [Sd, C] (C = longest context, padded with slot 0) and the valid-key mask [Sd, 1, 1, C].
    decode_rows: torch.Tensor = None
    decode_slots: torch.Tensor = None
    decode_mask: torch.Tensor = None
    # Prefill chunks, one entry per stream: (first row, rows, KV slots [C], causal mask or None).
    prefills: List[tuple] = field(default_factory=list)


def _slots(block_table: np.ndarray, length: int, block_size: int) -> np.ndarray:
    pos = np.arange(length)
    return block_table[pos // block_size].astype(np.int64) * block_size + pos % block_size


class CpuBackend(DeviceBackend):
    name = "cpu"
    device = torch.device("cpu")
    block_sizes = (16, 32, 64)

    def __init__(self):
        from rtp_llm.ops import ensure_compute_ops_loaded

        self._ops = ensure_compute_ops_loaded()

    def allocate_kv_cache(self, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype):
        return torch.zeros(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)

    def available_memory_bytes(self) -> int:
        try:
            pages = os.sysconf("SC_AVPHYS_PAGES")
            return int(pages * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            return 4 << 30

    def prepare_attention(self, batch, block_size: int) -> CpuAttentionMetadata:
        meta = CpuAttentionMetadata(slot_mapping=torch.from_numpy(batch.slot_mapping.astype(np.int64)))
        q_lens, ctx, starts = batch.query_lens, batch.context_lens, batch.query_starts
        decode = np.nonzero(q_lens == 1)[0]
        if len(decode):
            c = int(ctx[decode].max())
            pos = np.arange(c)
            tables = batch.block_tables[decode]
            slots = np.take_along_axis(tables, np.minimum(pos // block_size, tables.shape[1] - 1)[None, :].repeat(
                len(decode), 0), axis=1).astype(np.int64) * block_size + pos % block_size
            valid = pos[None, :] < ctx[decode][:, None]
            meta.decode_rows = torch.from_numpy(starts[decode].astype(np.int64))
            meta.decode_slots = torch.from_numpy(np.where(valid, slots, 0))
            meta.decode_mask = torch.from_numpy(valid)[:, None, None, :]
        for i in np.nonzero(q_lens > 1)[0]:
            n, c = int(q_lens[i]), int(ctx[i])
            slots = torch.from_numpy(_slots(batch.block_tables[i], c, block_size))
            mask = None
            if n != c:  # a chunk after a cached prefix: query j sees keys up to c - n + j
                mask = torch.arange(c)[None, :] <= torch.arange(c - n, c)[:, None]
            meta.prefills.append((int(starts[i]), n, slots, mask))
        return meta

    def write_kv(self, k, v, kv, meta):
        flat = kv.view(2, -1, kv.shape[-2], kv.shape[-1])
        flat[0].index_copy_(0, meta.slot_mapping, k)
        flat[1].index_copy_(0, meta.slot_mapping, v)

    def attention(self, q, kv, meta, scale):
        out = torch.empty_like(q)
        k_flat = kv[0].reshape(-1, kv.shape[-2], kv.shape[-1])
        v_flat = kv[1].reshape(-1, kv.shape[-2], kv.shape[-1])
        if meta.decode_rows is not None:
            k = k_flat[meta.decode_slots].transpose(1, 2)  # [Sd, Hkv, C, D]
            v = v_flat[meta.decode_slots].transpose(1, 2)
            qd = q[meta.decode_rows].unsqueeze(2)          # [Sd, H, 1, D]
            o = F.scaled_dot_product_attention(qd, k, v, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True)
            out[meta.decode_rows] = o.squeeze(2)
        for start, n, slots, mask in meta.prefills:
            k = k_flat[slots].transpose(0, 1).unsqueeze(0)  # [1, Hkv, C, D]
            v = v_flat[slots].transpose(0, 1).unsqueeze(0)
            qp = q[start:start + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            o = F.scaled_dot_product_attention(qp, k, v, attn_mask=mask, is_causal=mask is None, scale=scale,
                                               enable_gqa=True)
            out[start:start + n] = o.squeeze(0).transpose(0, 1)
        return out

    def rms_norm(self, x, weight, eps):
        return self._ops.rms_norm(x, weight, eps)

    def silu_and_mul(self, x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
