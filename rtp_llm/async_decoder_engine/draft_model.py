"""Speculative decoding with a separate draft model (--sp_type=vanilla: upstream's "vanilla",
vLLM's draft model): a smaller model of the target's tokenizer proposes each drafting stream's
next tokens, and the target verifies them in the step that proposed them
(rtp_llm/cpp/engine/scheduler.h, "Speculative decoding").

The draft's KV cache mirrors the target's: a pool of the same block count, indexed by the same
block tables and slots, so the core's block bookkeeping (allocation, preemption, the prefix
cache, rolling back rejected drafts) serves both. Invariant: wherever a target block holds a
computed position, the draft's block holds the draft's K and V of that position's token, but
for at most the one position a stream's last round proposed without running. A broken invariant
costs acceptance, never correctness: whatever the drafts are, the target's samples decide what
is kept.

Each step the target runs:
  1. its drafting streams (the core reserved d positions after each one's last token:
     DeferredDrafter) get their drafts: d draft steps over them (propose()). Step 0 runs each
     stream's last known token at its position, after the token of the position before when
     the draft has not run it (the last round's last draft, accepted: Proposals), and yields
     draft 1; step j runs draft j from the step before's greedy tokens on the device
     (placeholder ids, as overlap scheduling's). One host copy at the end writes the proposals
     over the reserved positions of the batch's token_ids. The steps wrote the draft's K and V
     of every position but the last draft's.
  2. its other streams (prompts, plain decodes) run through the draft first (the mirror: their
     token ids, positions and slots, no logits), so the draft sees every prompt and kept token.
  3. the target's forward, sampling and commit, as with any drafter.

Drafts are the draft model's argmax: a point mass, the distribution the rejection sampler
assumes of a drafter, so sampled rows keep the target's distribution exactly.
"""

import logging
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

log = logging.getLogger(__name__)

# Benchmark only: a rate r in (0, 1] makes every verify row keep its draft with probability r,
# whatever the target sampled (random weights accept nothing; this measures the speed at a chosen
# acceptance rate). The text is then not the model's: never set it outside a benchmark.
FORCE_ACCEPT_ENV = "RTP_LLM_BENCH_FORCE_ACCEPT"


def force_accept_rate() -> float:
    """FORCE_ACCEPT_ENV's rate, 0 when unset."""
    raw = os.environ.get(FORCE_ACCEPT_ENV, "")
    if not raw:
        return 0.0
    rate = float(raw)
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"{FORCE_ACCEPT_ENV} must be in (0, 1], got {raw!r}")
    log.warning("benchmark only: %s=%g keeps drafts whatever the model samples; the text is not the model's",
                FORCE_ACCEPT_ENV, rate)
    return rate


def force_accept_for_benchmark(rate: float) -> None:
    """A benchmark tool's --force_accept: engines made after this keep drafts at `rate` (0: off)."""
    if rate:
        os.environ[FORCE_ACCEPT_ENV] = str(rate)


def force_acceptance(tokens: torch.Tensor, draft_tokens: Optional[np.ndarray], rate: float,
                     generator: torch.Generator, values: Optional[torch.Tensor] = None) -> torch.Tensor:
    """tokens [N] (the step's samples, on the device) with each verify row (draft_tokens[r] >= 0)
    replaced by its draft with probability `rate` (FORCE_ACCEPT_ENV). generator: on tokens' device;
    values: the drafts [N] on the device where the drafter left them there (DeviceDrafts).
    Queued behind the step without a host sync (a blocking upload here would wait for the step's
    forward and distort the very timing it serves)."""
    if draft_tokens is None or not (draft_tokens >= 0).any():
        return tokens
    drafts = values if values is not None else torch.from_numpy(draft_tokens).to(tokens.device, non_blocking=True)
    drafts = drafts.to(tokens.dtype)
    draws = torch.rand(len(draft_tokens), generator=generator, device=tokens.device)
    return torch.where((drafts >= 0) & (draws < rate), drafts, tokens)


@dataclass
class DraftBatch:
    """A step of the draft model: the StepBatch fields that DeviceBackend.prepare_inputs and the
    graph runners read. Per token: token_ids [T] (-1 - r: row r of the step before's samples),
    positions [T], slot_mapping [T] int64; per stream: query_lens [S] (its last positions, in
    order) and block_tables [S, B]. Each stream's last token is sampled."""

    token_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    query_lens: np.ndarray
    block_tables: np.ndarray

    def __post_init__(self):
        s, t = len(self.query_lens), len(self.token_ids)
        self.num_streams, self.num_tokens, self.num_sampled = s, t, s
        self.num_draft_tokens = self.num_prompt_logprobs = 0
        self.query_lens = self.query_lens.astype(np.int32)
        self.query_starts = np.r_[0, np.cumsum(self.query_lens)].astype(np.int32)
        self.context_lens = (self.positions[self.query_starts[1:] - 1] + 1).astype(np.int32)
        self.prefix_lens = self.context_lens - self.query_lens
        self.num_prefill = int((self.query_lens > 1).sum())
        self.block_table_stride = self.block_tables.shape[1]
        self.do_sample = np.ones(s, np.int32)
        self.draft_lens = np.zeros(s, np.int32)
        self.prompt_targets = np.full(t, -1, np.int32)


def mirror_batch(b, streams: np.ndarray) -> DraftBatch:
    """StepBatch b's rows of the streams where `streams` [S] is true, as they are."""
    tokens = np.repeat(streams, b.query_lens)
    return DraftBatch(b.token_ids[tokens], b.positions[tokens], b.slot_mapping[tokens], b.query_lens[streams],
                      np.ascontiguousarray(b.block_tables[streams]))


def write_drafts(b, first: np.ndarray, d: np.ndarray, drafts: np.ndarray) -> None:
    """Writes a drafter's steps 0..max(d)-1 (their greedy tokens concatenated in step order; step j
    has a row for each drafting stream with d > j) over b's reserved positions: step j's row of a
    stream is its draft j + 1, at query token first + 1 + j (first: its last known token)."""
    b.token_ids[draft_token_indices(first, d)] = drafts


def draft_token_indices(first: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The query token each of a drafter's proposals fills, in write_drafts' order (step j's row
    of a stream with d > j: first + 1 + j) -> [sum(d)] int64."""
    steps = range(int(d.max()) if len(d) else 0)
    return np.concatenate([first[d > j] + 1 + j for j in steps] or [np.zeros(0, np.int64)]).astype(np.int64)


class DeviceDrafts:
    """A step's drafts left on the device (a drafting head's: eagle_drafter.py), so that nothing
    waits for them before the target's step is queued: values [D] (device, int64) fill the query
    tokens `at` [D] of StepBatch b. The target's forward takes them into its token ids there
    (scatter()), the sampler's verify rows read them there (values_at()), and they reach
    b.token_ids, which commit compares with the samples, with the step's samples (land(): the
    step's one host sync). Until then b.token_ids holds the core's placeholder at those tokens."""

    def __init__(self, b, at: np.ndarray, values: torch.Tensor, upload):
        """upload: a host int64 array on the device without waiting for it."""
        self.b, self.at, self.values = b, at, values
        self._upload = upload
        self.at_dev = upload(at)
        self._index = np.full(len(b.token_ids), -1, np.int64)  # query token -> its draft in values (-1: none)
        self._index[at] = np.arange(len(at))

    def scatter(self, token_ids: torch.Tensor) -> None:
        """Writes the drafts into the step's token ids [T] on the device."""
        token_ids[self.at_dev] = self.values.to(token_ids.dtype)

    def values_at(self, tokens: np.ndarray) -> torch.Tensor:
        """The drafts at query tokens `tokens` (any shape; -1, or a token without a draft: -1), as an
        int64 tensor of that shape on the device: e.g. the draft each sampler row verifies, from
        its draft_at (ops/draft_rows.py)."""
        which = self._upload(np.where(tokens >= 0, self._index[np.maximum(tokens, 0)], -1))
        got = self.values[which.clamp(min=0)]
        return torch.where(which >= 0, got, torch.full_like(got, -1))

    def land(self, host: np.ndarray) -> None:
        """b's drafted tokens from their host copy (host [D], copied after the step's sampling)."""
        self.b.token_ids[self.at] = host[:len(self.at)]


class Proposals:
    """A step's drafts: the drafting streams (draft_lens > 0) of StepBatch `b`, each with its last
    known token at query index first[k], at position prefix_lens (the target has computed every
    position before it), and d[k] reserved positions after it.

    seen: stream id -> (v, token), what DraftModel knows of the draft's cache: positions below v
    hold the draft's K and V of the stream's tokens, and token is the one at v when the draft
    proposed it without running it (its last draft of a round), else -1. If the round accepted
    every draft, the stream's prefix is v + 1: step 0 then runs that token before the last one."""

    def __init__(self, b, seen: dict, block_size: int):
        self.b = b
        self.streams = np.nonzero(b.draft_lens > 0)[0]
        self.d = b.draft_lens[self.streams].astype(np.int64)
        self.first = b.query_starts[self.streams + 1].astype(np.int64) - 1 - self.d
        self.prefix = b.prefix_lens[self.streams].astype(np.int64)
        known = [seen.get(int(i), (-1, -1)) for i in b.stream_ids[self.streams]]
        self.gap = np.array([tok if v == p - 1 else -1 for (v, tok), p in zip(known, self.prefix)], np.int64)
        self.block_size = block_size

    @property
    def steps(self) -> int:
        return int(self.d.max()) if len(self.d) else 0

    def batch(self, j: int) -> DraftBatch:
        """Draft step j (0-based) over the streams with more than j drafts, each sampled at
        position prefix + j: step 0 from its last known token (after the unseen one, if any), a
        later step from draft j, its row's greedy token in step j - 1 (placeholder -1 - row)."""
        if j == 0:
            return self._catch_up()
        keep = self.d > j
        at = self.first[keep] + j
        b = self.b
        row = np.cumsum(self.d > j - 1) - 1  # each stream's row in step j - 1
        return DraftBatch((-1 - row[keep]).astype(np.int32), b.positions[at], b.slot_mapping[at],
                          np.ones(int(keep.sum()), np.int32), np.ascontiguousarray(b.block_tables[self.streams[keep]]))

    def _catch_up(self) -> DraftBatch:
        b, g = self.b, self.gap >= 0
        q = 1 + g.astype(np.int64)
        last = np.cumsum(q) - 1
        tokens = np.empty(int(q.sum()), np.int32)
        positions = np.empty_like(tokens)
        slots = np.empty(len(tokens), np.int64)
        tokens[last], positions[last], slots[last] = (b.token_ids[self.first], b.positions[self.first],
                                                      b.slot_mapping[self.first])
        gi, pos = last[g] - 1, self.prefix[g] - 1
        blocks = b.block_tables[self.streams[g], pos // self.block_size].astype(np.int64)
        tokens[gi], positions[gi], slots[gi] = self.gap[g], pos, blocks * self.block_size + pos % self.block_size
        return DraftBatch(tokens, positions, slots, q, np.ascontiguousarray(b.block_tables[self.streams]))

    def write(self, drafts: np.ndarray, seen: dict) -> None:
        """Writes the drafts over the reserved positions (write_drafts) and records in `seen` what
        the draft's cache now holds: positions below prefix + d, and the last draft, proposed but
        not run."""
        write_drafts(self.b, self.first, self.d, drafts)
        ids = self.b.stream_ids[self.streams].tolist()
        seen.update(zip(ids, zip((self.prefix + self.d).tolist(), self.b.token_ids[self.first + self.d].tolist())))


class DraftModel:
    """The draft model's runner (a ModelRunner over the draft model and its mirrored KV cache):
    stage(b) proposes b's drafts and stages the mirror of b's other streams (module docstring)."""

    def __init__(self, runner, max_streams: int):
        self.runner = runner
        self.seen = {}  # stream id -> (v, token): Proposals
        self._max_seen = 4 * max_streams

    def propose(self, b) -> None:
        """Fills b's reserved draft positions with the draft model's greedy tokens (one host sync)."""
        p = Proposals(b, self.seen, self.runner.block_size)
        prev, outs = None, []
        for j in range(p.steps):
            logits = self.runner.logits(p.batch(j), prev)
            prev = self.runner.backend.argmax(logits).to(torch.int32)
            outs.append(prev)
        if outs:
            p.write(torch.cat(outs).cpu().numpy(), self.seen)

    def stage(self, b):
        """b's drafts proposed (when it has any, into b.token_ids), then (the mirror's StagedStep over
        b's streams that do not draft (None when all do: their proposals ran their positions), None:
        no drafts on the device)."""
        drafting = b.draft_lens > 0
        if drafting.any():
            self.propose(b)
        rest = ~drafting
        ids = b.stream_ids
        if len(self.seen) > self._max_seen:  # (streams that ended: only the batch's are kept)
            self.seen = {i: self.seen[i] for i in ids.tolist() if i in self.seen}
        self.seen.update(zip(ids[rest].tolist(), zip(b.context_lens[rest].tolist(), [-1] * int(rest.sum()))))
        if not rest.any():
            return None, None
        return self.runner.stage(b if rest.all() else mirror_batch(b, rest), logits=False), None


def check_draft(target, draft, sp_checkpoint_path: str) -> None:
    """Refuses a draft model (a ModelConfig) whose tokens the target could not take: ids past the
    target's vocabulary. (Same tokenizer is the user's contract; a smaller padded vocabulary is
    fine.)"""
    if draft.vocab_size > target.vocab_size:
        raise ValueError(f"--sp_checkpoint_path {sp_checkpoint_path}: the draft model's vocabulary "
                         f"({draft.vocab_size}) is larger than the target's ({target.vocab_size}); the draft "
                         f"must share the target's tokenizer")


def load_draft(spec, target, device: str):
    """The draft model of `spec` (a SpeculativeConfig with sp_type vanilla), loaded as the target
    (a LoadedModel) was: its dtype and load format, on `device`, unquantized, without a tokenizer."""
    from rtp_llm.model_loader import load_model

    return load_model(spec.sp_checkpoint_path, spec.sp_model_type or None, target.dtype, progress=False,
                      load_format=target.load_format, tokenizer=False, device=device)
