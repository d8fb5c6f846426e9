"""Speculative decoding with an EAGLE-3 head (--sp_type=eagle3; models_py/eagle3.py): drafts from
one layer fed the target's hidden states, verified by the target in the step that proposed them
(rtp_llm/cpp/engine/scheduler.h, "Speculative decoding"; the core reserves the drafted positions
and the model runner fills them, as for a draft model: draft_model.py).

The head's KV cache mirrors the target's block for block (same block tables and slots). Its row
at position i reads t_{i+1}, the token after i, and the target's hidden state at i. So a
position's row can run only once the target computed it and the next token is known: right after
the target's step is sampled (after_sample), over the step's rows, each taking the next query
token or, for a sampled row, the row's sample. In a verify step the samples of the rows up to the
first rejected draft are exactly the kept tokens (each accepted draft equals the sample before
it), so those rows are right; the rows after it are written again when their positions are next
computed. Invariant: the head's cache holds the head's K and V for every position of a stream
below its last known token, but for
  - the last position of a prompt chunk that does not end the prompt (its next token is the next
    chunk's first): its hidden state waits in the carry table and the row runs with that chunk;
  - the last position of a prefix taken from the prefix cache, whose row was run by the stream
    that computed it, with that stream's next token.
A broken invariant costs acceptance, never correctness: the target's samples decide what is kept.

The same post-step pass leaves, per sampled stream, draft 1 (the head's token from the row of the
last kept position) and that row's output h in the state table. When the stream next drafts
(stage), draft j + 1 (j >= 1) comes from a row at the position of its last known token + j - 1,
reading draft j and the previous row's h: d - 1 head steps over the drafting streams, their K/V
written at positions the core reserved for the step (written again by its post-step pass). The
drafts stay on the device (draft_model.DeviceDrafts: the target's step is queued behind them
without waiting for them) and reach the batch's token ids with the step's samples; a step whose
drafting streams have penalties copies them first (their rows' histories hold the drafts: one
host sync)."""

from typing import Optional

import numpy as np
import torch

from rtp_llm.async_decoder_engine.draft_model import DeviceDrafts, DraftBatch, draft_token_indices
from rtp_llm.device.base import sampled_token_rows
from rtp_llm.models_py.eagle3 import Eagle3Head


class StreamTable:
    """Device rows kept per stream between its steps: `slot(id)` gives a stream its row, reusing
    the rows of streams absent from the recent batches when full (their state is then lost: their
    next drafts are rejected, nothing else)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.rows = {}  # stream id -> row

    def slot(self, stream_id: int, live: set) -> int:
        row = self.rows.get(stream_id)
        if row is None:
            if len(self.rows) >= self.capacity:
                self.rows = {i: r for i, r in self.rows.items() if i in live}
            used = set(self.rows.values())
            row = next(r for r in range(self.capacity) if r not in used)
            self.rows[stream_id] = row
        return row


class EagleDrafter:
    """Drafts with an Eagle3Head on `kv_cache` (one layer, mirroring the target's pool)."""

    def __init__(self, head: Eagle3Head, backend, kv_cache: torch.Tensor, block_size: int, max_streams: int,
                 aux_width: int, dtype: torch.dtype, graphs=None):
        """graphs: the head's draft steps captured (DeviceBackend.make_head_graphs), or None: eager."""
        self.head, self.backend, self.kv_cache, self.block_size = head, backend, kv_cache, block_size
        self.graphs = graphs
        cap = 2 * max_streams + 2  # streams running, plus those preempted or waiting between their steps
        dev = backend.device
        self.table = StreamTable(cap)
        self.draft1 = torch.zeros(cap, dtype=torch.int64, device=dev)            # [cap] draft 1 per stream
        self.h = torch.zeros(cap, head.hidden_size, dtype=dtype, device=dev)    # [cap, H] its row's output
        self.carry = torch.zeros(cap, aux_width, dtype=dtype, device=dev)       # [cap, 3 Ht] a chunk's last row
        self.carried = {}  # stream id -> (position, KV slot) of its carried row

    def _dev(self, a: np.ndarray) -> torch.Tensor:
        """A host index array on the device, without waiting for the device (a plain .to() would)."""
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.backend.device, non_blocking=True)

    # ------------------------------------------------------------------ after the target's step

    def after_sample(self, b, aux: torch.Tensor, samples: torch.Tensor, drafts: Optional[DeviceDrafts] = None) -> None:
        """The head's rows of step b (module docstring), queued behind its sampling. aux [T, 3 Ht]:
        the target's hidden states of b's tokens; samples [N]: b's sampled tokens (device); drafts:
        b's drafts where they are on the device (stage())."""
        S, T = b.num_streams, b.num_tokens
        qs, ids = b.query_starts.astype(np.int64), b.stream_ids
        live = set(ids.tolist())
        stream = np.repeat(np.arange(S), b.query_lens)
        sampled = sampled_token_rows(b).astype(np.int64)
        # each token's next token: the next query token, or for a sampled row its sample (placeholder -1 - row)
        nxt = np.empty(T, np.int64)
        nxt[:-1] = b.token_ids[1:]
        nxt[sampled] = -1 - np.arange(len(sampled))
        keep = np.ones(T, bool)
        last = qs[1:] - 1
        chunk_end = last[b.do_sample != 1]  # a chunk that does not end its prompt: its last row waits
        keep[chunk_end] = False
        # rows carried from the stream's previous chunk, when this step continues right after it
        cin = [(s, *self.carried.pop(int(ids[s]))) for s in range(S) if int(ids[s]) in self.carried]
        cin = [(s, pos, slot) for s, pos, slot in cin if pos == b.positions[qs[s]] - 1]
        kept = np.nonzero(keep)[0]
        c_streams = np.array([s for s, _, _ in cin], np.int64)
        row_stream = np.concatenate([stream[kept], c_streams])
        row_pos = np.concatenate([b.positions[kept].astype(np.int64), np.array([p for _, p, _ in cin], np.int64)])
        order = np.lexsort((row_pos, row_stream))
        if not len(order):
            self._carry_out(b, aux, chunk_end, live)
            return
        tokens = np.concatenate([nxt[kept], b.token_ids[qs[c_streams]].astype(np.int64)])[order]
        slots = np.concatenate([b.slot_mapping[kept].astype(np.int64),
                                np.array([x for _, _, x in cin], np.int64)])[order]
        row_stream, row_pos = row_stream[order], row_pos[order]
        streams, qlens = np.unique(row_stream, return_counts=True)
        batch = DraftBatch(tokens.astype(np.int32), row_pos.astype(np.int32), slots, qlens.astype(np.int32),
                           np.ascontiguousarray(b.block_tables[streams]))
        # the hidden rows: aux for this step's tokens, the carry table for carried rows
        src = np.concatenate([kept, -1 - np.array([self.table.slot(int(ids[s]), live) for s, _, _ in cin], np.int64)])
        src = src[order]
        hidden = aux.new_empty(len(src), aux.shape[1])
        own = np.nonzero(src >= 0)[0]
        hidden[self._dev(own)] = aux[self._dev(src[own])]
        if len(cin):
            car = np.nonzero(src < 0)[0]
            hidden[self._dev(car)] = self.carry[self._dev(-1 - src[car])]
        self._carry_out(b, aux, chunk_end, live)
        rows, targets = self._proposal_rows(b, row_stream, samples, drafts)
        x = self.backend.prepare_inputs(batch, self.block_size)
        self.backend.resolve_placeholders(x.token_ids, samples)
        draft1, h = self.head.forward(x.token_ids, x.positions, x.meta, self.kv_cache, hidden, rows)
        at = self._dev(np.array([self.table.slot(int(i), live) for i in targets], np.int64))
        self.draft1[at] = draft1
        self.h[at] = h

    def _carry_out(self, b, aux: torch.Tensor, chunk_end: np.ndarray, live: set) -> None:
        """Keeps the last row of each chunk that does not end its prompt for the stream's next chunk."""
        if not len(chunk_end):
            return
        stream_of = np.searchsorted(b.query_starts, chunk_end, side="right") - 1
        at = []
        for s, t in zip(stream_of.tolist(), chunk_end.tolist()):
            i = int(b.stream_ids[s])
            at.append(self.table.slot(i, live))
            self.carried[i] = (int(b.positions[t]), int(b.slot_mapping[t]))
        self.carry[self._dev(np.array(at, np.int64))] = aux[self._dev(chunk_end)]

    def _proposal_rows(self, b, row_stream: np.ndarray, samples: torch.Tensor, on_device: Optional[DeviceDrafts]):
        """(rows [P] on the device, the row of each sampled stream's last kept position in the head's
        batch; stream ids [P]). A verify stream's kept positions run to its first rejected draft,
        counted on the device from its samples (no host sync)."""
        sampling = np.nonzero(b.do_sample == 1)[0]
        ends = np.searchsorted(row_stream, sampling, side="right")  # one past each stream's last head row
        d = b.draft_lens[sampling].astype(np.int64)
        base = self._dev(ends - 1 - d)
        if not d.any():
            return base, b.stream_ids[sampling]
        # per stream its samples (rows first..first + d - 1) against its drafts (query tokens after the first)
        dmax = int(d.max())
        first = np.r_[0, np.cumsum(1 + d)][:-1]
        j = np.arange(dmax)
        valid = j[None, :] < d[:, None]
        idx = np.where(valid, first[:, None] + j[None, :], 0)
        qend = b.query_starts[sampling + 1].astype(np.int64)
        at = np.where(valid, qend[:, None] - d[:, None] + j[None, :], -1)
        drafts = (on_device.values_at(at) if on_device is not None
                  else self._dev(np.where(valid, b.token_ids[np.maximum(at, 0)], -1).astype(np.int64)))
        same = samples.long()[self._dev(idx)] == drafts  # (-1 past a stream's drafts: never a sample)
        accepted = same.int().cumprod(dim=1).sum(dim=1)
        return base + accepted, b.stream_ids[sampling]

    # ------------------------------------------------------------------ before the target's step

    def stage(self, b):
        """(None: nothing to stage for the target, the head's rows of b run after it (after_sample);
        b's drafts where they stay on the device, else None: b has none, or they are in b.token_ids)."""
        drafting = np.nonzero(b.draft_lens > 0)[0]
        return None, (self.propose(b, drafting) if len(drafting) else None)

    def propose(self, b, drafting: np.ndarray) -> Optional[DeviceDrafts]:
        d = b.draft_lens[drafting].astype(np.int64)
        first = b.query_starts[drafting + 1].astype(np.int64) - 1 - d  # each stream's last known token
        live = set(b.stream_ids.tolist())
        at = self._dev(np.array([self.table.slot(int(i), live) for i in b.stream_ids[drafting]], np.int64))
        tok, h = self.draft1[at], self.h[at]
        values = self._chained(b, drafting, d, first, tok, h)
        if values is None:
            values = torch.cat(self._stepped(b, drafting, d, first, tok, h))
        at = draft_token_indices(first, d)
        if (b.history_lens[drafting] > 0).any():  # (penalized rows read their drafts on the host: ops/draft_rows.py)
            b.token_ids[at] = values.cpu().numpy()
            return None
        return DeviceDrafts(b, at, values, self._dev)

    def _chained(self, b, drafting: np.ndarray, d: np.ndarray, first: np.ndarray, tok: torch.Tensor,
                 h: torch.Tensor) -> Optional[torch.Tensor]:
        """Every drafting stream's drafts in draft_token_indices' order: draft 1 (tok), then drafts
        2..d by the captured chain (device/cuda/head_graphs.py); None where drafts beyond the first
        are wanted and no graph fits. Chain step j runs every stream at the position of its last
        known token + j (kept there, slot -1, once the stream has its d drafts)."""
        steps = int(d.max()) - 1
        if steps < 1:
            return tok
        if self.graphs is None:
            return None
        j = np.arange(steps)[:, None]
        active = d[None, :] > j + 1  # [steps, S]
        t = np.where(active, first[None, :] + j, first[None, :])
        slots = np.where(active, b.slot_mapping[t], -1)
        chain = self.graphs.run(tok, h, b.positions[t], slots, b.block_tables[drafting])
        if chain is None:
            return None
        every = torch.cat([tok[None], chain]).reshape(-1)  # [(1 + steps) * S], step-major
        if active.all():
            return every
        return every[self._dev(np.flatnonzero(np.concatenate([np.ones((1, len(d)), bool), active])))]

    def _stepped(self, b, drafting: np.ndarray, d: np.ndarray, first: np.ndarray, tok: torch.Tensor,
                 h: torch.Tensor) -> list:
        """The draft steps one by one, eagerly, each over the streams that draft one more:
        [draft 1 of every stream, draft 2 of those with d > 1, ...]."""
        outs = [tok]
        for j in range(1, int(d.max())):
            keep = d > j
            sel = self._dev(np.nonzero(keep[d > j - 1])[0])
            t = first[keep] + j - 1
            prev_n = int((d > j - 1).sum())
            batch = DraftBatch((-1 - np.arange(prev_n)[keep[d > j - 1]]).astype(np.int32), b.positions[t],
                               b.slot_mapping[t], np.ones(int(keep.sum()), np.int32),
                               np.ascontiguousarray(b.block_tables[drafting[keep]]))
            x = self.backend.prepare_inputs(batch, self.block_size)
            self.backend.resolve_placeholders(x.token_ids, tok)
            tok, h = self.head.forward(x.token_ids, x.positions, x.meta, self.kv_cache, h[sel],
                                       torch.arange(batch.num_streams, device=self.backend.device))
            outs.append(tok)
        return outs
