"""Speculative decoding with a separate draft model (--sp_type=vanilla: upstream's "vanilla",
vLLM's draft model): a smaller model of the target's tokenizer proposes each drafting stream's
next tokens, and the target verifies them in the step that proposed them
(rtp_llm/cpp/engine/scheduler.h, "Speculative decoding").

The draft's KV cache mirrors the target's: a pool of the same block count, indexed by the same
block tables and slots, so the core's block bookkeeping (allocation, preemption, the prefix
cache, rolling back rejected drafts) serves both. Invariant: wherever a target block holds a
computed position, the draft's block holds the draft's K and V of that position's token. It
holds because every step the target runs, the draft runs first over the same inputs (the
mirror: same token ids, positions and slots, no logits), so the draft sees the prompt and every
kept token exactly as the target does. A broken invariant costs acceptance, never correctness:
whatever the drafts are, the target's samples decide what is kept.

A step in which streams draft (the core reserved d positions after each one's last token:
DeferredDrafter):
  1. propose(): d draft decode steps over the drafting streams, the first from each stream's last
     known token at its position, each later one from the step before's greedy tokens on the
     device (placeholder ids, as overlap scheduling's); one host copy at the end writes the d
     proposals over the reserved positions of the batch's token_ids.
  2. the mirror over the whole batch (its drafting streams' rows rewrite the proposals' slots
     with the same tokens), then the target's forward, sampling and commit as for any drafter.

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


def force_acceptance(tokens: torch.Tensor, draft_tokens: Optional[np.ndarray], rate: float,
                     generator: torch.Generator) -> torch.Tensor:
    """tokens [N] (the step's samples, on the device) with each verify row (draft_tokens[r] >= 0)
    replaced by its draft with probability `rate` (FORCE_ACCEPT_ENV)."""
    if draft_tokens is None or not (draft_tokens >= 0).any():
        return tokens
    drafts = torch.from_numpy(draft_tokens).to(tokens.device, tokens.dtype)
    take = (drafts >= 0) & (torch.rand(len(draft_tokens), generator=generator).to(tokens.device) < rate)
    return torch.where(take, drafts, tokens)


@dataclass
class ProposalBatch:
    """One draft decode step over the drafting streams, one token each: the StepBatch fields that
    DeviceBackend.prepare_inputs and the graph runners read. token_ids [S] (-1 - r: row r of the
    step before's proposals), positions [S], slot_mapping [S] int64, block_tables [S, B]."""

    token_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    block_tables: np.ndarray

    def __post_init__(self):
        s = len(self.token_ids)
        self.num_streams = self.num_tokens = self.num_sampled = s
        self.num_prefill = self.num_draft_tokens = self.num_prompt_logprobs = 0
        self.block_table_stride = self.block_tables.shape[1]
        self.query_lens = np.ones(s, np.int32)
        self.prefix_lens = self.positions.astype(np.int32)
        self.context_lens = self.prefix_lens + 1
        self.query_starts = np.arange(s + 1, dtype=np.int32)
        self.do_sample = np.ones(s, np.int32)
        self.draft_lens = np.zeros(s, np.int32)
        self.prompt_targets = np.full(s, -1, np.int32)


class Proposals:
    """Where a step's drafts go: the drafting streams (draft_lens > 0) of StepBatch `b`, each
    with its first query token (its last known token) at index first[k] and d[k] drafts after it."""

    def __init__(self, b):
        self.b = b
        self.streams = np.nonzero(b.draft_lens > 0)[0]
        self.d = b.draft_lens[self.streams].astype(np.int64)
        self.first = b.query_starts[self.streams + 1].astype(np.int64) - 1 - self.d

    @property
    def steps(self) -> int:
        return int(self.d.max()) if len(self.d) else 0

    def batch(self, j: int) -> ProposalBatch:
        """Draft step j (0-based): the streams with more than j drafts, each running query token
        first + j; its token is the stream's last known one (j = 0) or draft j, the greedy token
        of its row in step j - 1 (placeholder -1 - row)."""
        keep = self.d > j
        at = self.first[keep] + j
        b = self.b
        if j == 0:
            tokens = b.token_ids[at].astype(np.int32)
        else:
            row = np.cumsum(self.d > j - 1) - 1  # each stream's row in step j - 1
            tokens = (-1 - row[keep]).astype(np.int32)
        return ProposalBatch(tokens, b.positions[at].astype(np.int32), b.slot_mapping[at].astype(np.int64),
                             np.ascontiguousarray(b.block_tables[self.streams[keep]]))

    def write(self, drafts: np.ndarray) -> None:
        """Writes step 0.. step d-1's greedy tokens (concatenated in step order) over the reserved
        positions: step j's row of a stream is its draft j + 1, at query token first + 1 + j."""
        at = 0
        for j in range(self.steps):
            keep = self.d > j
            n = int(keep.sum())
            self.b.token_ids[self.first[keep] + 1 + j] = drafts[at:at + n]
            at += n


class DraftModel:
    """The draft model's runner (a ModelRunner over the draft model and its mirrored KV cache):
    stage(b) proposes b's drafts and stages the mirror over b (module docstring)."""

    def __init__(self, runner):
        self.runner = runner

    def propose(self, b) -> None:
        """Fills b's reserved draft positions with the draft model's greedy tokens (one host sync)."""
        p = Proposals(b)
        prev, outs = None, []
        for j in range(p.steps):
            logits = self.runner.logits(p.batch(j), prev)
            prev = self.runner.backend.argmax(logits).to(torch.int32)
            outs.append(prev)
        if outs:
            p.write(torch.cat(outs).cpu().numpy())

    def stage(self, b):
        """b's drafts proposed (when it has any), then the mirror's StagedStep over b."""
        if b.num_draft_tokens:
            self.propose(b)
        return self.runner.stage(b, logits=False)


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
