"""Turns the core's step batch into device tensors, runs the model and samples.

launch() queues a step on the device and returns at once with its PendingStep: the sampled
tokens stay on the device for the step scheduled ahead of them (its placeholder token ids read
them there) and travel to pinned host memory for commit(). Waiting for them is the one
host-device sync of a step.

A step runs in three calls: stage() does its host work and queues its input uploads (nothing
in it reads the step before's tokens), forward() queues the model on those inputs (resolving
placeholder ids from the step before's sampled tokens, on the device), sample() queues the
sampling. launch() is the three in a row. The engine's overlapped loop (engine.py) interleaves
them across steps; in particular a step with grammar rows (grammar.py) samples only once the
step before committed (its tokens advance the matchers the mask is filled from), after the step
behind it was staged, so that step's forward queues right behind the sampling.

Prompt log-probs (a step with prompt rows: num_prompt_logprobs > 0): the forward runs eagerly (no
captured graph computes those rows) and yields logits for the sampled rows, then the prompt rows;
models_py/prompt_logprobs.py turns the latter into log-probs on the device, and they reach the
host with the sampled tokens. Steps without prompt rows are untouched (graphs, no extra copy).

Speculative decoding (a step with drafts: num_draft_tokens > 0; rtp_llm/cpp/engine/scheduler.h):
each drafting stream runs its last token and its drafts, and every one of those positions is
sampled (device/base.py sampled_token_rows; the sampler's rows repeat the stream's parameters:
StepBatch.sampled_streams()), so the step yields num_sampled + num_draft_tokens tokens, which
commit verifies. Where the device has graphs, the extend graph of the step's token count computes
those rows (within its row count; else the step runs eagerly). With a draft model (`drafter`:
draft_model.py) stage() first has it propose the step's drafts and stage its mirror of the step,
whose forward then precedes the target's. An EAGLE-3 head (eagle_drafter.py) proposes in stage()
too, and runs its rows of the step right after the step's sampling, on the model's hidden states;
its drafts stay on the device (DeviceDrafts: the forward scatters them into its token ids, the
sampler reads them there) and reach the batch with the samples, in the step's one sync."""

import os
import threading
import time
from typing import Callable, Optional, Tuple

import numpy as np
import torch

from rtp_llm.async_decoder_engine.draft_model import DeviceDrafts, DraftModel, force_accept_rate, force_acceptance
from rtp_llm.async_decoder_engine.grammar import MaskFill
from rtp_llm.device.base import DeviceBackend
from rtp_llm.distributed.tensor_parallel import CollectiveError
from rtp_llm.models_py.decoder import DecoderModel
from rtp_llm.models_py.prompt_logprobs import PromptLogprobs, prompt_logprobs
from rtp_llm.models_py.sampler import Sampled, Sampler
from rtp_llm.ops.engine_core import EngineCore, PromptRows, StepBatch, max_top_logprobs


def _inject(kind: str, token: int):
    what = f"injected fault (RTP_LLM_TEST_FAIL_ON_TOKEN={token}:{kind})"
    if kind == "oom":
        raise torch.OutOfMemoryError(what)
    if kind == "memory":
        raise MemoryError(what)
    if kind == "hang":
        threading.Event().wait()
    raise RuntimeError(what)


class HostSlot:
    """Host buffers for one step's samples (pinned where the device copies asynchronously):
    tokens and log-probs [max_batch_size], alternatives [max_batch_size, max_top]."""

    def __init__(self, max_batch_size: int, max_top: int, pin: bool, ready):
        self.tokens = torch.zeros(max_batch_size, dtype=torch.int32, pin_memory=pin)
        self.logprobs = torch.zeros(max_batch_size, dtype=torch.float32, pin_memory=pin)
        self.top_ids = torch.zeros(max_batch_size, max_top, dtype=torch.int32, pin_memory=pin)
        self.top_logprobs = torch.zeros(max_batch_size, max_top, dtype=torch.float32, pin_memory=pin)
        self.drafts = torch.zeros(max_batch_size, dtype=torch.int64, pin_memory=pin)  # (DeviceDrafts' values)
        self.ready = ready  # the device's copy event, None where copies are synchronous


class PendingStep:
    """A launched step's sampled tokens: on the device now, on the host once result() returns."""

    def __init__(self, sampled: Sampled, slot: HostSlot, timeout_s: float = 0.0,
                 prompt: Optional[PromptLogprobs] = None, drafts: Optional[DeviceDrafts] = None):
        """drafts: the step's drafts where they were on the device: in its batch once result() returns."""
        self.tokens = sampled.tokens  # [N] int32 on the device
        n = len(sampled.tokens)
        self.drafts = drafts
        if drafts is not None:
            slot.drafts[:len(drafts.at)].copy_(drafts.values, non_blocking=True)
            self._drafts_host = slot.drafts[:len(drafts.at)].numpy()
        slot.tokens[:n].copy_(sampled.tokens, non_blocking=True)
        if sampled.logprobs is not None:
            slot.logprobs[:n].copy_(sampled.logprobs, non_blocking=True)
        else:
            slot.logprobs[:n].zero_()
        k = 0 if sampled.top_ids is None else sampled.top_ids.shape[1]
        if k:
            slot.top_ids[:n, :k].copy_(sampled.top_ids, non_blocking=True)
            slot.top_logprobs[:n, :k].copy_(sampled.top_logprobs, non_blocking=True)
        self._host = (slot.tokens[:n].numpy(), slot.logprobs[:n].numpy(), slot.top_ids[:n, :k].numpy(),
                      slot.top_logprobs[:n, :k].numpy())
        self._ready = slot.ready
        self._timeout_s = timeout_s
        # The prompt rows' host copies (their size varies by step: fresh buffers, pinned where the
        # device copies asynchronously), before the event that result() waits for.
        self._prompt = None if prompt is None else PromptRows(*(
            None if t is None else torch.empty(t.shape, dtype=t.dtype, pin_memory=slot.ready is not None)
            .copy_(t, non_blocking=True) for t in prompt))
        if self._ready is not None:
            self._ready.record()
        self.committed = False
        # The grammar rows: (stream ids [G], their indices in the sampled rows [G]), and their
        # mask's fill (checked at commit); None without grammar rows.
        self.grammar: Optional[Tuple[np.ndarray, np.ndarray]] = None
        self.mask: Optional[MaskFill] = None

    def result(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(tokens [N] int32, log-probs [N] fp32 (0 where not asked), alternatives' ids [N, k]
        int32 and log-probs [N, k] fp32), views valid until the host slot is reused two launches
        later (commit them before that): EngineCore.commit's arguments."""
        if self._ready is not None:
            if self._timeout_s > 0:  # tensor parallel: a dead rank leaves the step's collectives waiting
                deadline = time.monotonic() + self._timeout_s
                while not self._ready.query():
                    if time.monotonic() > deadline:
                        raise CollectiveError(f"a tensor-parallel step did not finish in --dist_timeout_s="
                                              f"{self._timeout_s:g} s: a rank died or hung")
                    time.sleep(0)
            self._ready.synchronize()
        if self.drafts is not None:
            self.drafts.land(self._drafts_host)
        return self._host

    def prompt_rows(self) -> Optional[PromptRows]:
        """The step's prompt rows as numpy (after result()), or None when it has none."""
        if self._prompt is None:
            return None
        return PromptRows(*(None if t is None else t.numpy() for t in self._prompt))


# A staged forward: run(prev_tokens, drafts) queues it and returns its logits. prev_tokens: the step
# before's samples, which its placeholder ids name; drafts: its drafts on the device (DeviceDrafts),
# scattered into its token ids first (None: none, or they are in the batch's token ids).
Run = Callable[[Optional[torch.Tensor], Optional[DeviceDrafts]], torch.Tensor]


class StagedStep:
    """A step whose inputs are on their way to the device (stage()): run(prev_tokens, drafts)
    queues its forward and returns the logits [num_sampled (+ prompt rows), vocab] fp32.
    placeholders: its token ids name the tokens the step before samples (scheduled ahead of
    them); drafts: its drafts where the drafter left them on the device."""

    def __init__(self, batch: StepBatch, run: Run, drafts: Optional[DeviceDrafts] = None):
        self.batch, self.run, self.drafts = batch, run, drafts
        self.placeholders = bool((batch.token_ids < 0).any())

    def after(self, first: "StagedStep") -> "StagedStep":
        """This step with `first` (staged over the same batch, without drafts of its own) queued
        before its forward."""
        run = self.run

        def both(prev_tokens: Optional[torch.Tensor], drafts: Optional[DeviceDrafts] = None) -> torch.Tensor:
            first.run(prev_tokens, None)
            return run(prev_tokens, drafts)
        return StagedStep(self.batch, both, self.drafts)


class Forwarded:
    """A step whose forward is queued: logits [num_sampled, vocab] fp32 on the device, and its
    prompt rows' log-probs (None when it has none). Sampled by ModelRunner.sample()."""

    def __init__(self, batch: StepBatch, logits: torch.Tensor, prompt: Optional[PromptLogprobs],
                 aux: Optional[torch.Tensor] = None, drafts: Optional[DeviceDrafts] = None):
        self.batch, self.logits, self.prompt = batch, logits, prompt
        self.aux = aux  # the model's hidden states for an EAGLE-3 head (DecoderModel.aux), else None
        self.drafts = drafts  # its drafts on the device (StagedStep's)
        self.rows = None     # its SamplingRows, once fill_mask() took them
        self.grammar = None  # its grammar rows (stream ids [G], indices in the sampled rows [G]), likewise

    @property
    def needs_mask(self) -> bool:
        """It has grammar rows: their mask needs the step before committed."""
        return self.batch.num_grammar > 0


class ModelRunner:
    def __init__(self, model: DecoderModel, backend: DeviceBackend, kv_cache: torch.Tensor, block_size: int,
                 max_batch_size: int, max_seq_len: int, max_num_batched_tokens: int, use_graphs: bool = True,
                 max_sampled_rows: int = 0, bind: bool = True):
        """max_sampled_rows: a step's most sampled rows (default max_batch_size; speculative decoding
        samples 1 + draft_lens rows per stream). bind: sizes the backend's workspaces for this model
        (False for a draft model beside the target, whose shapes the backend keeps)."""
        # Test-only fault injection: a step whose batch holds one of these token ids fails.
        # "499" raises a RuntimeError; "499:oom,498:hang" picks the fault per token: out of
        # memory (torch.OutOfMemoryError), MemoryError ("memory") or a step that never ends.
        poison = os.environ.get("RTP_LLM_TEST_FAIL_ON_TOKEN") or ""
        self.faults = {int(t): kind or "error" for t, _, kind in (p.partition(":") for p in poison.split(",") if p)}
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        self.block_size = block_size
        # Host slots for the sampled tokens of the (at most two) steps in flight, used in turn.
        # Where the device copies asynchronously (it gives an event to wait on), they are
        # pinned and the copies do not block.
        events = [backend.host_copy_event(), backend.host_copy_event()]
        pin = events[0] is not None
        self.sampler = Sampler(backend.device, pin_host=pin, argmax=backend.argmax,
                               apply_token_bitmask=backend.apply_token_bitmask)
        self.grammar = None  # rank 0's GrammarBook (EngineLoop sets it)
        self.drafter = None  # DraftModel or EagleDrafter, which fills the drafted positions (EngineLoop sets it)
        self._force_accept = force_accept_rate()  # benchmark only (draft_model.FORCE_ACCEPT_ENV)
        self._force_gen = torch.Generator(device=backend.device).manual_seed(0)
        if bind:
            backend.bind_model(model.num_heads, model.num_kv_heads, model.config.head_dim, max_batch_size,
                               max_seq_len)
        # Steps replay captured graphs where the device has them (CUDA) and the model allows
        # (DecoderModel.graph_capturable: not MoE or MLA layers on a backend whose kernels sync).
        self.graphs = backend.make_graph_runner(model, kv_cache, block_size, max_batch_size, max_seq_len,
                                                max_num_batched_tokens, max_sampled_rows) if use_graphs and model.graph_capturable else None
        self._slots = [HostSlot(max(max_batch_size, max_sampled_rows), max_top_logprobs(), pin, e) for e in events]
        self._slot = 0
        self._prev_sampled = 0  # rows sampled by the last step run: a rank > 0 receives that many

    def logits(self, b: StepBatch, prev_tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """[num_sampled, vocab] fp32 logits of the streams whose next token this step yields (then
        its prompt rows'). prev_tokens: the step before's sampled tokens, when `b` was scheduled
        ahead of them. (A rank > 0 steps with this; so do tests.)"""
        return self._run(self.stage(b), prev_tokens)

    def stage(self, b: StepBatch, logits: bool = True) -> StagedStep:
        """b's host work and input uploads, queued behind the device's current work. logits=False:
        the forward only fills the KV cache (a draft model's mirror; a replayed graph computes its
        logits anyway)."""
        for token, kind in self.faults.items():
            if (b.token_ids == token).any():
                _inject(kind, token)
        # The drafter proposes b's drafts (into b.token_ids, or on the device: drafts) before anything
        # reads them, and a draft model stages its mirror of the other streams (first; None: none).
        first, drafts = self.drafter.stage(b) if self.drafter is not None else (None, None)
        staged = self._stage(b, logits)
        staged.drafts = drafts
        return staged if first is None else staged.after(first)

    def _stage(self, b: StepBatch, logits: bool) -> StagedStep:
        # Steps with prompt rows run eagerly: no captured graph computes those rows.
        if self.graphs is not None and not b.num_prompt_logprobs:
            replay = self.graphs.stage(b)
            if replay is not None:
                return StagedStep(b, replay)
        x = self.backend.prepare_inputs(b, self.block_size)
        rows = self._with_prompt_rows(b, x.sample_rows) if b.num_prompt_logprobs else x.sample_rows
        if not logits:
            rows = x.token_ids[:0]

        def run(prev_tokens: Optional[torch.Tensor], drafts: Optional[DeviceDrafts] = None) -> torch.Tensor:
            if prev_tokens is not None:
                self.backend.resolve_placeholders(x.token_ids, prev_tokens)
            if drafts is not None:
                drafts.scatter(x.token_ids)
            return self.model.forward(x.token_ids, x.positions, x.meta, self.kv_cache, rows)
        return StagedStep(b, run)

    def _run(self, staged: StagedStep, prev_tokens: Optional[torch.Tensor]) -> torch.Tensor:
        """Queues the staged forward. Under tensor parallelism rank 0's prev_tokens reach every
        rank first (stream-ordered, no host sync); a rank > 0 receives them (prev_tokens None)."""
        b = staged.batch
        if staged.placeholders:
            tp = self.model.tp
            if tp.size > 1:
                if prev_tokens is None:
                    prev_tokens = torch.empty(self._prev_sampled, dtype=torch.int32, device=self.backend.device)
                tp.broadcast(prev_tokens)
        else:
            prev_tokens = None
        self._prev_sampled = b.num_sampled + b.num_draft_tokens
        return staged.run(prev_tokens, staged.drafts)

    def _with_prompt_rows(self, b, sample_rows: Optional[torch.Tensor]) -> torch.Tensor:
        """[N + P] on the device: the sampled rows (prepare_inputs'; None: all T), then the prompt
        rows (prompt_targets >= 0, token order)."""
        dev = self.backend.device
        if sample_rows is None:
            sample_rows = torch.arange(b.num_tokens, device=dev)
        prompt = torch.from_numpy(np.nonzero(b.prompt_targets >= 0)[0]).to(dev)
        return torch.cat([sample_rows.long(), prompt.long()])

    def _prompt_logprobs(self, logits: torch.Tensor, b: StepBatch) -> PromptLogprobs:
        """The prompt rows' log-probs from their logits [P, V], with k = the step's largest
        prompt_logprobs (each stream keeps its own k of them)."""
        targets = b.prompt_targets[b.prompt_targets >= 0].astype(np.int64)
        k = max(0, int(b.prompt_logprobs.max()))
        return prompt_logprobs(logits, torch.from_numpy(targets).to(logits.device), k)

    def forward(self, staged: StagedStep, prev: Optional[PendingStep] = None) -> Forwarded:
        """Queues the staged step's forward. prev: the step it was scheduled ahead of (sampled,
        its tokens still on the device)."""
        b = staged.batch
        logits = self._run(staged, prev.tokens if prev is not None else None)
        prompt = None
        if b.num_prompt_logprobs:
            n = b.num_sampled + b.num_draft_tokens
            prompt = self._prompt_logprobs(logits[n:], b)
            logits = logits[:n]
        return Forwarded(b, logits, prompt, self.model.aux, staged.drafts)

    def fill_mask(self, f: Forwarded) -> Optional[MaskFill]:
        """Starts filling f's grammar rows' mask (None: f has none); the step before f must have
        committed (its tokens advanced the matchers). Taken by sample(f, mask)."""
        if not f.needs_mask:
            return None
        b = f.batch
        streams = b.sampled_streams()
        f.rows = b.rows(streams)
        g = np.nonzero(f.rows.grammar)[0]
        f.grammar = (b.stream_ids[streams][g], g)
        return self.grammar.fill(*f.grammar)

    def sample(self, f: Forwarded, mask: Optional[MaskFill] = None) -> PendingStep:
        """Queues f's sampling. Its grammar rows' mask (`mask`, from fill_mask(f); filled here
        when not given) is filled from their matchers, so the step before f must have committed
        (f.needs_mask: the caller orders it)."""
        if mask is None and f.needs_mask:
            mask = self.fill_mask(f)
        rows = f.rows if f.rows is not None else f.batch.rows(f.batch.sampled_streams())
        if f.drafts is not None:
            rows.draft_values = f.drafts.values_at(rows.draft_at)
        samples = self.sampler.sample_on_device(f.logits, rows, mask.result() if mask is not None else None)
        if self._force_accept:
            samples = samples._replace(tokens=force_acceptance(samples.tokens, rows.draft_tokens, self._force_accept,
                                                               self._force_gen, rows.draft_values))
        if f.aux is not None:  # an EAGLE-3 head's rows of this step (eagle_drafter.py), behind its sampling
            self.drafter.after_sample(f.batch, f.aux, samples.tokens, f.drafts)
        slot = self._slots[self._slot]
        self._slot ^= 1
        step = PendingStep(samples, slot, self.model.tp.timeout_s if self.model.tp.size > 1 else 0.0, f.prompt,
                           f.drafts)
        step.grammar, step.mask = f.grammar, mask
        return step

    def launch(self, b: StepBatch) -> PendingStep:
        """Stages, runs and samples `b` (nothing in flight before it)."""
        return self.sample(self.forward(self.stage(b)))

    def commit(self, core: EngineCore, step: PendingStep):
        """Commits a launched step's tokens (once; waits for them) and advances its grammar rows'
        matchers on the tokens the core kept."""
        if step.committed:
            return
        tokens, logprobs, top_ids, top_logprobs = step.result()
        if step.mask is not None:
            step.mask.check()  # (its tokens were sampled under a mask that a failed fill left unfinished)
        appended = core.commit(tokens, logprobs, top_ids, top_logprobs, step.prompt_rows())
        step.committed = True
        if step.grammar is not None:
            ids, g = step.grammar
            self.grammar.advance(ids, tokens[g], appended[g])

    def step(self, core: EngineCore, b: StepBatch):
        """Runs `b` and commits the sampled tokens to `core` (no overlap)."""
        self.commit(core, self.launch(b))
