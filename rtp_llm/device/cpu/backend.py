"""CPU backend: the compute-ops extension's kernels: paged attention (prefill, chunks after a
cached prefix and decode in one call, reading K/V through the block tables), KV store,
rotary, fused residual-add + RMSNorm and SiLU-and-mul."""

import os
from dataclasses import dataclass

import torch

from rtp_llm.device.base import AttentionMetadata, DeviceBackend


@dataclass
class CpuAttentionMetadata(AttentionMetadata):
    # Zero-copy views of the core's step batch (valid for this step only).
    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [S, B] int32
    query_starts: torch.Tensor  # [S + 1] int32
    context_lens: torch.Tensor  # [S] int32


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
        return CpuAttentionMetadata(
            slot_mapping=torch.from_numpy(batch.slot_mapping),
            block_tables=torch.from_numpy(batch.block_tables),
            query_starts=torch.from_numpy(batch.query_starts),
            context_lens=torch.from_numpy(batch.context_lens),
        )

    def write_kv(self, k, v, kv, meta):
        self._ops.store_kv(k, v, kv, meta.slot_mapping)

    def attention(self, q, kv, meta, scale):
        return self._ops.paged_attention(q, kv[0], kv[1], meta.block_tables, meta.query_starts, meta.context_lens,
                                         scale)

    def rms_norm(self, x, weight, eps):
        return self._ops.rms_norm(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):
        return self._ops.fused_add_rms_norm(x, residual, weight, eps)

    def rotary(self, q, k, positions, cos, sin):
        self._ops.rotary_embedding(q, k, positions, cos, sin)
        return q, k

    def silu_and_mul(self, x):
        return self._ops.silu_and_mul(x)
