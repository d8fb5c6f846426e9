"""A drafting head's draft steps as CUDA graphs (async_decoder_engine/eagle_drafter.py: EAGLE-3 or
MTP). A step's d - 1 draft steps each run one row per drafting stream, a decode step of the head,
and each reads the last one's drafts and outputs: so they are captured as one chain, a graph per
(batch size of the decode ladder, chain length 1..max_chain), replayed with one upload of every
step's inputs. Eagerly each step's ~25 kernels cost more host time to launch than the device takes
to run them (and one graph per step still costs its staging each, ~0.5 ms of host time a step with
the device idle behind it).

Inputs go through one persistent buffer as the target's graphs' (graph_runner._Inputs), per step
[max_chain, n] positions, slots and context lengths; the block tables are the same for every step.
A row without a draft at step j (a stream that drafts fewer tokens, or padding) has slot -1 and
context 0 there: it reads and writes nothing, and its garbage stays in its own row (every op but
attention is row-wise). The chain's first tokens and hidden states come through [n] / [n, H]
buffers."""

import logging
import time
from typing import Optional

import numpy as np
import torch

from rtp_llm.device.cuda.graph_runner import _Inputs, decode_batch_sizes
from rtp_llm.device.cuda.metadata import CudaAttentionMetadata

log = logging.getLogger(__name__)


class HeadGraphRunner:
    def __init__(self, head, backend, kv_cache: torch.Tensor, block_size: int, max_streams: int, max_seq_len: int,
                 dtype: torch.dtype, max_chain: int):
        """max_chain: the most draft steps a step runs (gen_num_per_cycle - 1)."""
        dev = backend.device
        self.head, self.backend, self.kv_cache = head, backend, kv_cache
        self.max_seq_len, self.max_chain = max_seq_len, max(1, max_chain)
        self.max_blocks = -(-max_seq_len // block_size)
        self.sizes = decode_batch_sizes(max_streams)
        self.n = n = self.sizes[-1]
        # per step j, rows [j * n, j * n + n) of positions, slots and context_lens
        self.x = _Inputs(self.max_chain * n, self.max_chain * n, 0, self.max_blocks, dev, tables=n)
        self.x.host_view("slots")[:] = -1
        self.x.host_view("query_starts")[:n + 1] = np.arange(n + 1)
        self.x.upload(n)
        self.tokens = torch.zeros(n, dtype=torch.int32, device=dev)  # the chain's input drafts (token ids are int32)
        self.hidden = torch.zeros(n, head.hidden_size, dtype=dtype, device=dev)
        # Every tensor a graph reads must outlive it: a local one would be freed at the end of
        # __init__ and its memory reused, and the replays would read whatever lands there.
        self.rows = torch.arange(n, device=dev)
        self.graphs = {}  # (size, chain length) -> (replay, drafts [length, size])
        t0 = time.perf_counter()
        self._capture()
        log.info("captured %d draft-chain graphs of the head (batch %d..%d, 1..%d steps) in %.1f s", len(self.graphs),
                 self.sizes[0], n, self.max_chain, time.perf_counter() - t0)

    def _chain(self, size: int, length: int) -> torch.Tensor:
        """The head's draft steps 1..length over the buffers' first `size` rows: drafts [length, size]."""
        x, n = self.x, self.n
        tok, h = self.tokens[:size], self.hidden[:size]
        bt = x.dev("block_tables").view(-1, self.max_blocks)[:size]
        qs = x.dev("query_starts")[:size + 1]
        outs = []
        for j in range(length):
            lo = j * n
            meta = CudaAttentionMetadata(slot_mapping=x.dev("slots")[lo:lo + size], block_tables=bt, query_starts=qs,
                                         context_lens=x.dev("context_lens")[lo:lo + size],
                                         decode_splits=self.backend.decode_splits(size, self.max_seq_len))
            drafts, h = self.head.forward(tok, x.dev("positions")[lo:lo + size], meta, self.kv_cache, h,
                                          self.rows[:size])
            outs.append(drafts)
            tok = drafts.int()
        return torch.stack(outs)

    def _capture(self) -> None:
        dev = self.backend.device
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        pool = None
        with torch.inference_mode(), torch.cuda.stream(stream):
            for s in reversed(self.sizes):  # largest first: the smaller graphs reuse its pool
                for length in range(self.max_chain, 0, -1):
                    self._chain(s, length)  # compiles the kernels, settles the allocator
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool, stream=stream):
                        out = self._chain(s, length)
                    pool = g.pool()
                    self.graphs[(s, length)] = (g.replay, out)
        torch.cuda.current_stream(dev).wait_stream(stream)
        torch.cuda.synchronize(dev)

    def run(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: np.ndarray, slots: np.ndarray,
            block_tables: np.ndarray) -> Optional[torch.Tensor]:
        """L = len(positions) draft steps of S = len(tokens) streams from their first drafts tokens
        [S] and hidden states [S, H] (device): positions, slots [L, S] (slot -1: no draft at that
        step); block_tables [S, B]. Returns drafts [L, S] (valid until the next replay; garbage
        where the slot is -1), or None where no graph fits."""
        length, s = positions.shape
        if s > self.n or length > self.max_chain or block_tables.shape[1] > self.max_blocks:
            return None
        size = self.sizes[np.searchsorted(self.sizes, s)]
        x, n = self.x.writable(), self.n
        pos, sl, ctx = (x.host_view(k).reshape(self.max_chain, n) for k in ("positions", "slots", "context_lens"))
        pos[:length, :s] = positions
        sl[:length, :s] = slots
        sl[:length, s:size] = -1
        ctx[:length, :s] = np.where(slots >= 0, positions + 1, 0)
        ctx[:length, s:size] = 0
        x.host_view("block_tables").reshape(-1, self.max_blocks)[:s, :block_tables.shape[1]] = block_tables
        x.upload(size)
        self.tokens[:s].copy_(tokens)
        self.hidden[:s].copy_(hidden)
        replay, drafts = self.graphs[(size, length)]
        replay()
        return drafts[:, :s]
