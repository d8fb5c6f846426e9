"""Decode steps as CUDA graphs. A decode step (every stream has one query token, all sampled)
of S streams replays the graph captured for the smallest ladder size >= S; its inputs are
copied into persistent buffers first (one host-to-device copy from a pinned staging buffer),
and the padding streams have context length 0 and slot -1: they read and write nothing."""

import logging
import time
from typing import Dict, List, Tuple

import numpy as np
import torch

from rtp_llm.device.cuda import kernels as K
from rtp_llm.device.cuda.backend import CudaAttentionMetadata

log = logging.getLogger(__name__)


def graph_batch_sizes(max_batch_size: int) -> List[int]:
    """1, 2, 4, 8, then every 8 up to 64, then every 16: padding wastes < 25% of a step."""
    sizes = [1, 2, 4, 8] + list(range(16, 65, 8)) + list(range(80, max_batch_size + 16, 16))
    out = sorted({min(s, max_batch_size) for s in sizes})
    return out


class CudaGraphRunner:
    def __init__(self, model, backend, kv_cache: torch.Tensor, block_size: int, max_batch_size: int,
                 max_seq_len: int):
        c = model.config
        self.model, self.kv_cache = model, kv_cache
        self.sizes = graph_batch_sizes(max_batch_size)
        n = self.max_streams = self.sizes[-1]
        self.max_blocks = -(-max_seq_len // block_size)
        dev = backend.device
        # Packed int32 inputs: token ids, positions, slots, context lengths (n each), then the
        # block tables [n, max_blocks].
        size = 4 * n + n * self.max_blocks
        self.host = torch.zeros(size, dtype=torch.int32, pin_memory=True)
        self.host_np = self.host.numpy()
        self.buf = torch.zeros(size, dtype=torch.int32, device=dev)
        self.token_ids, self.positions, self.slots, self.context_lens = (self.buf[i * n:(i + 1) * n] for i in range(4))
        self.block_tables = self.buf[4 * n:].view(n, self.max_blocks)
        self.query_starts = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.host_np[2 * n:3 * n] = -1
        self.buf.copy_(self.host)
        backend.reserve_decode_workspace(n, c.num_heads, c.head_dim, K.decode_splits(1, c.num_kv_heads, max_seq_len,
                                                                                      backend.num_sms))
        t0 = time.perf_counter()
        pool = None
        stream = torch.cuda.Stream(dev)
        with torch.inference_mode(), torch.cuda.stream(stream):
            for s in reversed(self.sizes):  # largest first: the smaller ones reuse its memory pool
                meta = CudaAttentionMetadata(
                    slot_mapping=self.slots[:s], block_tables=self.block_tables[:s], query_starts=self.query_starts[:s + 1],
                    context_lens=self.context_lens[:s], max_query_len=1,
                    decode_splits=K.decode_splits(s, c.num_kv_heads, max_seq_len, backend.num_sms))
                args = (self.token_ids[:s], self.positions[:s], meta, kv_cache, None)
                model.forward(*args)  # compiles the kernels and settles the allocator outside capture
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool, stream=stream):
                    logits = model.forward(*args)
                pool = g.pool()
                self.graphs[s] = (g, logits)
        torch.cuda.current_stream(dev).wait_stream(stream)
        torch.cuda.synchronize(dev)
        log.info("captured %d decode graphs (batch sizes %s..%s) in %.1f s", len(self.sizes), self.sizes[0],
                 self.sizes[-1], time.perf_counter() - t0)

    def can_run(self, b) -> bool:
        return (0 < b.num_streams <= self.max_streams and b.num_tokens == b.num_streams
                and b.num_sampled == b.num_streams and b.block_tables.shape[1] <= self.max_blocks)

    def run(self, b) -> torch.Tensor:
        """Logits [S, vocab] fp32 of a decode step (a view into the graph's output: valid until
        the next run)."""
        s = b.num_streams
        size = self.sizes[np.searchsorted(self.sizes, s)]
        n, h = self.max_streams, self.host_np
        h[0:s] = b.token_ids
        h[n:n + s] = b.positions
        h[2 * n:2 * n + s] = b.slot_mapping
        h[2 * n + s:2 * n + size] = -1
        h[3 * n:3 * n + s] = b.context_lens
        h[3 * n + s:3 * n + size] = 0
        tables = h[4 * n:].reshape(n, self.max_blocks)
        tables[:s, :b.block_tables.shape[1]] = b.block_tables
        end = 4 * n + size * self.max_blocks
        # The previous step synced on its sampled tokens, so the staging buffer is free again.
        self.buf[:end].copy_(self.host[:end], non_blocking=True)
        g, logits = self.graphs[size]
        g.replay()
        return logits[:s]
