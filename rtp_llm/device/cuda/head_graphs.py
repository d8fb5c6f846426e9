"""A drafting head's draft steps as CUDA graphs (async_decoder_engine/eagle_drafter.py: EAGLE-3 or
MTP). Each of a step's d - 1 draft steps runs one row per drafting stream, a decode step of the
head: eagerly its ~25 kernels cost more host time to launch than the device takes to run them, and
the host waits for the drafts before the target's step can be staged.

Graphs are captured per batch size of the decode ladder (graph_runner.decode_batch_sizes) up to
the streams that may draft; inputs go through persistent buffers as the target's decode graphs'
(graph_runner._Inputs; padding rows have slot -1 and context 0: they read and write nothing) and
the hidden state through one [n, H] buffer."""

import logging
import time
from typing import Optional, Tuple

import numpy as np
import torch

from rtp_llm.device.cuda.graph_runner import _Inputs, decode_batch_sizes
from rtp_llm.device.cuda.metadata import CudaAttentionMetadata

log = logging.getLogger(__name__)


class HeadGraphRunner:
    def __init__(self, head, backend, kv_cache: torch.Tensor, block_size: int, max_streams: int, max_seq_len: int,
                 dtype: torch.dtype):
        dev = backend.device
        self.backend = backend
        self.max_blocks = -(-max_seq_len // block_size)
        self.sizes = decode_batch_sizes(max_streams)
        n = self.sizes[-1]
        self.x = _Inputs(n, n, 0, self.max_blocks, dev)
        self.x.host_view("slots")[:] = -1
        self.x.host_view("query_starts")[:] = np.arange(n + 1)
        self.x.upload(n)
        self.hidden = torch.zeros(n, head.hidden_size, dtype=dtype, device=dev)
        # Every tensor a graph reads must outlive it: a local one would be freed at the end of
        # __init__ and its memory reused, and the replays would read whatever lands there.
        self.rows = torch.arange(n, device=dev)
        self.graphs = {}  # size -> (replay, (drafts [size], h [size, H]))
        t0 = time.perf_counter()
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        pool = None
        with torch.inference_mode(), torch.cuda.stream(stream):
            for s in reversed(self.sizes):  # largest first: the smaller graphs reuse its pool
                meta = CudaAttentionMetadata(
                    slot_mapping=self.x.dev("slots")[:s],
                    block_tables=self.x.dev("block_tables").view(-1, self.max_blocks)[:s],
                    query_starts=self.x.dev("query_starts")[:s + 1], context_lens=self.x.dev("context_lens")[:s],
                    decode_splits=backend.decode_splits(s, max_seq_len))
                args = (self.x.dev("token_ids")[:s], self.x.dev("positions")[:s], meta, kv_cache, self.hidden[:s],
                        self.rows[:s])
                head.forward(*args)  # compiles the kernels, settles the allocator
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool, stream=stream):
                    out = head.forward(*args)
                pool = g.pool()
                self.graphs[s] = (g.replay, out)
        torch.cuda.current_stream(dev).wait_stream(stream)
        torch.cuda.synchronize(dev)
        log.info("captured %d draft-step graphs of the head (batch %d..%d) in %.1f s", len(self.sizes), self.sizes[0],
                 n, time.perf_counter() - t0)

    def run(self, b, prev_tokens: torch.Tensor, hidden: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """A draft step (eagle_drafter's DraftBatch b: one row per stream, token ids -1 - r naming
        prev_tokens[r]) on hidden [S, H]: (drafts [S], h [S, H]; h valid until the next replay), or
        None where no graph fits."""
        s = b.num_streams
        if s > self.sizes[-1] or b.block_tables.shape[1] > self.max_blocks:
            return None
        size = self.sizes[np.searchsorted(self.sizes, s)]
        x = self.x.stage_decode(b, size)
        self.backend.resolve_placeholders(x.dev("token_ids")[:s], prev_tokens)
        self.hidden[:s].copy_(hidden)
        replay, (drafts, h) = self.graphs[size]
        replay()
        return drafts[:s].clone(), h[:s]
