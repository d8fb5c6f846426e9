"""The CUDA backend's attention metadata: what its step inputs (backend.py) and its captured
graphs' persistent inputs (graph_runner.py) both hand the kernels."""

from dataclasses import dataclass
from typing import Optional

import torch

from rtp_llm.device.base import AttentionMetadata


@dataclass
class DecodeRows:
    """A mixed step's streams with one query token (int32 on the GPU, D of them), run by the
    split decode kernel beside the extend kernel's tiles of the others: as extend tiles they
    would take a 64-row tile each and read their keys once per query head, not per KV head."""
    rows: torch.Tensor          # [D] each one's query row (the decode kernel's query_starts)
    context_lens: torch.Tensor  # [D]
    block_tables: torch.Tensor  # [D, max_blocks]
    splits: int


@dataclass
class LatentContext:
    """An eager MLA step's prompt streams' whole contexts, for the expanded form
    (kernels.mla_prefill; kernels.context_slots built it on the host)."""
    slots: torch.Tensor  # [N] cache slots, stream after stream
    starts: torch.Tensor  # [S] where each prompt stream's begin in slots


@dataclass
class CudaAttentionMetadata(AttentionMetadata):
    # All int32 on the GPU. S streams, T tokens.
    slot_mapping: torch.Tensor   # [T]; < 0: padding row, not written
    block_tables: torch.Tensor   # [S, max_blocks]
    query_starts: torch.Tensor   # [S + 1]
    context_lens: torch.Tensor   # [S]; 0: padding stream
    # > 0 when every stream has one query token: the split-context decode kernel with this
    # many splits; 0: the extend kernel (prefill, chunks, mixed batches) over `tiles`.
    decode_splits: int
    tiles: Optional[torch.Tensor] = None  # [2, num_tiles]: kernels.extend_tiles
    decode_rows: Optional[DecodeRows] = None  # with tiles: one-token streams left out of them
    latent_context: Optional[LatentContext] = None  # an MLA step whose prompt rows expand (eager)
