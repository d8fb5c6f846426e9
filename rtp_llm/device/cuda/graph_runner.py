"""Steps as CUDA graphs, so that a step costs one launch instead of hundreds.

- Decode steps (every stream has one query token, all sampled) of S streams replay the graph
  captured for the smallest ladder size >= S, with the split-context decode kernel.
- Any other step of T tokens (prefill, prompt chunks, mixed batches with fewer than
  EAGER_DECODE_ROWS decodes, speculative verify steps) replays the graph captured for the
  smallest token bucket >= T, with the extend kernel over a tile table. Its logits rows are an
  input (sample_rows: one per sampled stream, or 1 + draft_lens per drafting one), at most the
  graph's row count: max_batch_size, or where the step may sample more (speculative decoding) its
  tokens up to max_sampled_rows in graphs of at most VERIFY_GRAPH_TOKENS tokens, so that a verify
  step replays too (eager, an 8B verify step's launches outlast its compute at batch 1).

Inputs are copied into persistent buffers first (one host-to-device copy from a pinned
staging buffer). Padding tokens have slot -1 and belong to no stream, padding streams have
no query rows and context length 0: they read and write nothing, and every op but attention
is row-wise, so their garbage stays in their own rows."""

import logging
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from rtp_llm.device.base import sampled_token_rows
from rtp_llm.device.cuda import kernels as K
from rtp_llm.device.cuda.metadata import CudaAttentionMetadata

log = logging.getLogger(__name__)


def decode_batch_sizes(max_batch_size: int) -> List[int]:
    """1, 2, 4, 8, then every 8 up to 64, then every 16: padding wastes < 25% of a step."""
    sizes = [1, 2, 4, 8] + list(range(16, 65, 8)) + list(range(80, max_batch_size + 16, 16))
    return sorted({min(s, max_batch_size) for s in sizes})


# Steps of more tokens are long enough that launching their kernels one by one costs little.
MAX_GRAPH_TOKENS = 2048


def extend_token_sizes(max_num_batched_tokens: int) -> List[int]:
    """Powers of two up to 512, then every 256, up to MAX_GRAPH_TOKENS."""
    top = min(max_num_batched_tokens, MAX_GRAPH_TOKENS)
    sizes = [16, 32, 64, 128, 256, 512] + list(range(768, top + 256, 256))
    return sorted({min(s, top) for s in sizes})


# Graphs of at most this many tokens take a row per token (up to max_sampled_rows): a verify step
# samples most of its tokens. Larger ones keep max_batch_size rows: every row costs its LM head
# (computed for the padding rows of a prompt chunk too); a verify step that large with more rows
# runs eagerly (hundreds of streams: its launches cost little beside its compute).
VERIFY_GRAPH_TOKENS = 512

# A mixed step with this many one-token streams runs eagerly: there they take the split decode
# kernel (metadata.DecodeRows), in a captured extend graph a 64-row tile each, whose keys are
# read once per query head. Below it, the graph's saved launches are worth more.
EAGER_DECODE_ROWS = 64


class _Inputs:
    """Persistent int32 inputs for graphs of up to `tokens` tokens and `streams` streams, packed
    in one device buffer with a pinned twin; the block tables come last so that a step copies
    only the rows it uses."""

    def __init__(self, tokens: int, streams: int, tiles: int, max_blocks: int, device, rows: int = 0,
                 tables: int = 0):
        """rows: the most sampled rows (default: one per stream); tables: the block tables' rows
        (default: one per stream)."""
        tiles = -(-tiles // 4) * 4
        sizes = dict(token_ids=tokens, positions=tokens, slots=tokens, query_starts=streams + 1,
                     context_lens=streams, sample_rows=max(rows, streams), tiles=2 * tiles,
                     block_tables=(tables or streams) * max_blocks)
        self.offsets, off = {}, 0
        for name, n in sizes.items():
            self.offsets[name] = (off, n)
            off += -(-n // 4) * 4  # 16-byte aligned parts, as the kernels were compiled for
        on_gpu = torch.device(device).type == "cuda"
        self.host = torch.zeros(off, dtype=torch.int32, pin_memory=on_gpu)
        self.buf = torch.zeros(off, dtype=torch.int32, device=device)
        self.max_blocks, self.n_tiles = max_blocks, tiles
        self.copied = torch.cuda.Event() if on_gpu else None

    def writable(self) -> "_Inputs":
        """Waits until the last upload has read the staging buffer. A step that samples nothing
        (a prompt chunk) ends without a sync, so the next one may come before that copy ran."""
        if self.copied is not None:
            self.copied.synchronize()
        return self

    def put(self, name: str, values: np.ndarray, upto: int, fill: int) -> None:
        """Part `name` on the host: `values`, then `fill` up to index `upto` (the padding)."""
        h = self.host_view(name)
        h[:len(values)] = values
        h[len(values):upto] = fill

    def host_view(self, name: str) -> np.ndarray:
        off, n = self.offsets[name]
        return self.host.numpy()[off:off + n]

    def dev(self, name: str) -> torch.Tensor:
        off, n = self.offsets[name]
        return self.buf[off:off + n]

    def stage_decode(self, b, size: int) -> "_Inputs":
        """A decode step's inputs (b: one query token per stream) uploaded for the graph of `size`
        streams (padding: slot -1, context 0)."""
        s = b.num_streams
        x = self.writable()
        x.host_view("token_ids")[:s] = b.token_ids
        x.host_view("positions")[:s] = b.positions
        x.put("slots", b.slot_mapping, size, -1)
        x.put("context_lens", b.context_lens, size, 0)
        x.host_view("block_tables").reshape(-1, self.max_blocks)[:s, :b.block_tables.shape[1]] = b.block_tables
        x.upload(size)
        return x

    def upload(self, streams: int):
        end = self.offsets["block_tables"][0] + streams * self.max_blocks
        self.buf[:end].copy_(self.host[:end], non_blocking=True)
        if self.copied is not None:
            self.copied.record()


class CudaGraphRunner:
    def __init__(self, model, backend, kv_cache: torch.Tensor, block_size: int, max_batch_size: int,
                 max_seq_len: int, max_num_batched_tokens: int, max_sampled_rows: int = 0):
        """max_sampled_rows: a step's most sampled rows (default max_batch_size; speculative decoding
        samples 1 + draft_lens rows per stream)."""
        dev = backend.device
        self.max_batch_size = max_batch_size
        self.max_rows = max(max_batch_size, max_sampled_rows)
        self.max_blocks = -(-max_seq_len // block_size)
        self.decode_sizes = decode_batch_sizes(max_batch_size)
        self.extend_sizes = extend_token_sizes(max_num_batched_tokens)
        n = self.decode_sizes[-1]
        self.dec = _Inputs(n, n, 0, self.max_blocks, dev)
        self.dec.host_view("slots")[:] = -1
        self.dec.host_view("query_starts")[:] = np.arange(n + 1)
        self.dec.upload(n)
        t_max = self.extend_sizes[-1]
        s_max, r_max = self._extend_streams(t_max), max(self._extend_rows(t) for t in self.extend_sizes)
        self.ext = _Inputs(t_max, s_max, t_max // K.EXTEND_BLOCK_M + s_max, self.max_blocks, dev, r_max)
        self.ext.host_view("slots")[:] = -1
        self.ext.host_view("tiles")[:self.ext.n_tiles] = -1  # row 0: no stream
        self.ext.upload(s_max)
        self.backend = backend
        # Every graph's logits land in this one buffer: a graph's output stays allocated while
        # the graph lives, so per-graph outputs would hold sum(sizes) x vocab floats (gigabytes
        # for a ladder up to 1024). Replays and their sampling are ordered on one stream.
        self.logits = torch.empty(max(n, r_max), model.config.vocab_size, dtype=torch.float32, device=dev)
        # Likewise the hidden states an EAGLE-3 head reads (DecoderModel.aux), where the model keeps them.
        self.model = model
        self.aux = (torch.empty(max(n, t_max), len(model.aux_layers) * model.config.hidden_size,
                                dtype=model.final_norm.dtype, device=dev) if model.aux_layers else None)
        # (kind, size) -> (replay, logits): replay() reruns the step on the current inputs and
        # leaves its logits in `logits`.
        self.graphs: Dict[Tuple[str, int], Tuple[Callable[[], None], torch.Tensor]] = {}
        t0 = time.perf_counter()
        self._capture(model, self._capture_plan(backend, kv_cache, max_seq_len), dev)
        log.info("captured %d decode graphs (batch %d..%d) and %d step graphs (tokens %d..%d) in %.1f s",
                 len(self.decode_sizes), self.decode_sizes[0], self.decode_sizes[-1], len(self.extend_sizes),
                 self.extend_sizes[0], self.extend_sizes[-1], time.perf_counter() - t0)

    def _capture(self, model, plan, dev):
        pool = None
        stream = torch.cuda.Stream(dev)
        # Capture runs on a side stream: it must see the buffers' initialization (and the
        # weights and KV cache), which were queued on the current one.
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.inference_mode(), torch.cuda.stream(stream):
            for kind, size, args in plan:
                model.forward(*args, logits_out=self.logits, aux_out=self.aux)  # compiles, settles the allocator
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool, stream=stream):
                    logits = model.forward(*args, logits_out=self.logits, aux_out=self.aux)
                pool = g.pool()
                self.graphs[(kind, size)] = (g.replay, logits)
        torch.cuda.current_stream(dev).wait_stream(stream)
        torch.cuda.synchronize(dev)

    def _capture_plan(self, backend, kv_cache, max_seq_len):
        """Largest first: the smaller graphs reuse its memory pool."""
        for t in reversed(self.extend_sizes):
            s = self._extend_streams(t)
            tiles = self.ext.dev("tiles").view(2, -1)[:, :t // K.EXTEND_BLOCK_M + s]
            meta = CudaAttentionMetadata(
                slot_mapping=self.ext.dev("slots")[:t],
                block_tables=self.ext.dev("block_tables").view(-1, self.max_blocks)[:s],
                query_starts=self.ext.dev("query_starts")[:s + 1], context_lens=self.ext.dev("context_lens")[:s],
                decode_splits=0, tiles=tiles)
            yield "extend", t, (self.ext.dev("token_ids")[:t], self.ext.dev("positions")[:t], meta, kv_cache,
                                self.ext.dev("sample_rows")[:self._extend_rows(t)])
        for s in reversed(self.decode_sizes):
            meta = CudaAttentionMetadata(
                slot_mapping=self.dec.dev("slots")[:s],
                block_tables=self.dec.dev("block_tables").view(-1, self.max_blocks)[:s],
                query_starts=self.dec.dev("query_starts")[:s + 1], context_lens=self.dec.dev("context_lens")[:s],
                decode_splits=backend.decode_splits(s, max_seq_len))
            yield "decode", s, (self.dec.dev("token_ids")[:s], self.dec.dev("positions")[:s], meta, kv_cache, None)

    def _extend_streams(self, tokens: int) -> int:
        return min(tokens, self.max_batch_size)

    def _extend_rows(self, tokens: int) -> int:
        """The sampled rows of the extend graph of `tokens` tokens (VERIFY_GRAPH_TOKENS)."""
        return min(tokens, self.max_rows if tokens <= VERIFY_GRAPH_TOKENS else self.max_batch_size)

    def stage(self, b) -> Optional[Callable[..., torch.Tensor]]:
        """Copies the step's inputs into the persistent buffers (queued behind the device's
        current work, which is done reading them) and returns replay(prev_tokens, drafts=None)
        (model_runner.Run): it queues the step and returns its logits [num_sampled, vocab] fp32 (a
        view into the graphs' output, valid until the next replay). None when no captured graph
        fits the step. prev_tokens: the tokens the step before sampled, for a step scheduled ahead
        of them (placeholder ids); drafts: its drafts on the device."""
        s, t = b.num_streams, b.num_tokens
        if s == 0 or b.block_tables.shape[1] > self.max_blocks:
            return None
        if t == s and b.num_sampled == s and s <= self.decode_sizes[-1]:
            return self._stage_decode(b)
        if t <= self.extend_sizes[-1] and s <= self.max_batch_size and (b.query_lens == 1).sum() < EAGER_DECODE_ROWS:
            return self._stage_extend(b)
        return None

    def _replayer(self, kind: str, size: int, x: _Inputs, t: int, rows: int):
        replay, logits = self.graphs[(kind, size)]

        def run(prev_tokens: Optional[torch.Tensor], drafts=None) -> torch.Tensor:
            """(model_runner.Run: drafts, a DeviceDrafts, scattered into the token ids)"""
            if prev_tokens is not None:
                self.backend.resolve_placeholders(x.dev("token_ids")[:t], prev_tokens)
            if drafts is not None:
                drafts.scatter(x.dev("token_ids")[:t])
            replay()
            if self.aux is not None:
                self.model.aux = self.aux[:t]
            return logits[:rows]
        return run

    def _stage_decode(self, b):
        s = b.num_streams
        size = self.decode_sizes[np.searchsorted(self.decode_sizes, s)]
        return self._replayer("decode", size, self.dec.stage_decode(b, size), s, s)

    def _stage_extend(self, b):
        s, t = b.num_streams, b.num_tokens
        size = self.extend_sizes[np.searchsorted(self.extend_sizes, t)]
        streams = self._extend_streams(size)
        x = self.ext.writable()
        x.host_view("token_ids")[:t] = b.token_ids
        x.host_view("positions")[:t] = b.positions
        x.put("slots", b.slot_mapping, size, -1)
        x.put("query_starts", b.query_starts, streams + 1, t)
        x.put("context_lens", b.context_lens, streams, 0)
        rows, cap = sampled_token_rows(b), self._extend_rows(size)
        if len(rows) > cap:  # (more rows than the runner was sized for: eager)
            return None
        x.put("sample_rows", rows, cap, 0)  # rows of an earlier, larger step would index out of bounds
        n_tiles = size // K.EXTEND_BLOCK_M + streams
        K.extend_tiles(b.query_lens, out=x.host_view("tiles").reshape(2, -1)[:, :n_tiles])
        x.host_view("block_tables").reshape(-1, self.max_blocks)[:s, :b.block_tables.shape[1]] = b.block_tables
        x.upload(s)
        return self._replayer("extend", size, x, t, len(rows))
