"""The CUDA backend's attention metadata: what its step inputs (backend.py) and its captured
graphs' persistent inputs (graph_runner.py) both hand the kernels."""

from dataclasses import dataclass
from typing import Optional

import torch

from rtp_llm.device.base import AttentionMetadata


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
