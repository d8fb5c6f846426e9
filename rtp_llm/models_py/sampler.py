"""Token sampling on the device: grammars' token masks, greedy, temperature, top-k, top-p,
min-p, repetition / presence / frequency penalties, logit_bias, a forced token (a spent thinking
budget), per-request seeds, and log-probs with their best alternatives.

Log-probs (the chosen token's and its top_logprobs alternatives) are those of the distribution
the token is drawn from before truncation: the model's logits after the grammar's mask, the
penalties, logit_bias, the forced token and the temperature (greedy rows: none), before top-k /
top-p / min-p. That is vLLM's "processed_logprobs" but for the truncation, which it applies too:
its masked tokens get -inf, which JSON cannot carry, and alternatives the truncation left out
would all read -inf.

A seeded row draws from its own generator seeded by (seed, tokens generated so far), so its
samples do not depend on which other requests share the batch (rejection_sampler.RowDraws).

Speculative decoding: a row verifying a drafted token (draft_tokens[r] >= 0) that does not
sample greedily keeps it or resamples by rejection sampling from the same distribution the
plain row draws from (rejection_sampler.py); a greedy row's argmax is compared with its draft by
the core, as the plain greedy step's.

`rows` is a step batch's SamplingRows (StepBatch.rows: rtp_llm/ops/engine_core.py): every
sampling parameter and num_generated [N] of the rows sampled, named as in
rtp_llm/cpp/engine/step_batch_fields.h, and the penalized rows' token history (prompt, then
generated): history_tokens[history_starts[r] +: history_lens[r]]; the rows' logit_bias entries
(bias_tokens / bias_values[bias_starts[r] +: bias_lens[r]]) and forced_tokens (-1: none); in a
step with drafts, draft_tokens [N] (else None), and each row's history and num_generated count
the drafts before it (rtp_llm/ops/draft_rows.py), so its penalties are the plain step's."""

from typing import Callable, NamedTuple, Optional

import numpy as np
import torch

from rtp_llm.device.base import apply_token_bitmask as torch_token_bitmask
from rtp_llm.models_py.rejection_sampler import RowDraws, sample_rows

_MASK = -float("inf")
# Temperatures below this sample greedily, the limit they tend to (vLLM's cut-off as well):
# dividing logits by, say, 1e-38 would overflow to inf and make the probabilities NaN.
_GREEDY_TEMPERATURE = 1e-5


def _repeated_ngram_ends(seq: np.ndarray, n: int) -> np.ndarray:
    """HF's no_repeat_ngram_size: the tokens that would complete an n-gram already in `seq` (the
    last n - 1 tokens followed by them occur earlier), int64."""
    if len(seq) < n:
        return np.zeros(0, np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(seq.astype(np.int64), n)
    tail = seq[len(seq) - n + 1:]
    return np.unique(windows[(windows[:, :n - 1] == tail).all(axis=1), n - 1])


class Sampled(NamedTuple):
    """One step's samples, left on the device."""

    tokens: torch.Tensor                  # [N] int32
    logprobs: Optional[torch.Tensor]      # [N] fp32 of the tokens, when a row asked (else None)
    top_ids: Optional[torch.Tensor]       # [N, k] int32, best first: k = the rows' largest top_logprobs
    top_logprobs: Optional[torch.Tensor]  # [N, k] fp32 (None when k is 0)


class Sampler:
    def __init__(self, device: torch.device, pin_host: bool = False,
                 argmax: Callable[[torch.Tensor], torch.Tensor] = lambda x: x.argmax(dim=-1),
                 apply_token_bitmask: Optional[Callable] = None):
        """pin_host: upload per-row parameters from pinned memory without blocking the host
        (an accelerator whose steps are queued ahead: a pageable upload would wait for them).
        argmax: [N, V] -> [N] int64 per row, torch.argmax's answer (DeviceBackend.argmax).
        apply_token_bitmask: (logits, rows, bits) masking in place (DeviceBackend's)."""
        self.device = device
        self.pin_host = pin_host
        self.argmax = argmax
        self.apply_token_bitmask = apply_token_bitmask or torch_token_bitmask

    @torch.inference_mode()
    def warm_up_mask(self, vocab: int):
        """Applies an allow-all grammar mask to one row of `vocab` logits: a device that compiles
        its kernels at first use (CUDA's Triton) compiles the mask's here, at start-up, not in the
        first structured request's step (a turn of ~0.4 s on the H200 machine)."""
        logits = torch.zeros(1, vocab, dtype=torch.float32, device=self.device)
        rows = torch.zeros(1, dtype=torch.int64, device=self.device)
        bits = torch.full((1, -(-vocab // 32)), -1, dtype=torch.int32, device=self.device)
        self.apply_token_bitmask(logits, rows, bits)

    def _upload(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a))
        if self.pin_host:
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    @torch.inference_mode()
    def sample_on_device(self, logits: torch.Tensor, rows, mask=None) -> Sampled:
        """logits: [N, V] fp32 (masked in place where `mask` says). mask: the grammar rows'
        token bitmask (async_decoder_engine.grammar.TokenBitmask), applied first; None when no
        row has a grammar. Returns the samples without waiting for the device."""
        n = logits.shape[0]
        if mask is not None:
            self.apply_token_bitmask(logits, mask.rows, mask.bits)
        logits = self._apply_forced(self._apply_bias(self._apply_penalties(logits, rows), rows), rows)
        greedy = (rows.temperature < _GREEDY_TEMPERATURE) | (rows.top_k == 1)
        s = np.nonzero(~greedy)[0]
        si = self._upload(s) if len(s) else None
        if len(s):  # the sampled rows' distribution: logits / temperature
            temp = self._upload(rows.temperature[s].astype(np.float32))[:, None]
            sampled = logits / temp if len(s) == n else logits[si] / temp
            logits = sampled if len(s) == n else logits.index_copy(0, si, sampled)
        tokens = torch.empty(n, dtype=torch.int64, device=logits.device)
        g = np.nonzero(greedy)[0]
        if len(g) == n:
            tokens = self.argmax(logits)
        elif len(g):
            gi = self._upload(g)
            tokens[gi] = self.argmax(logits[gi])
        if len(s):
            tokens[si] = self._draw(self._probs(sampled, rows, s), rows, s)
        return self._with_logprobs(logits, tokens, rows)

    def _draw(self, probs: torch.Tensor, rows, s: np.ndarray) -> torch.Tensor:
        """One token per row of probs [len(s), V] (rows s); rows verifying a draft by rejection
        sampling (rejection_sampler.py)."""
        drafts = None if rows.draft_tokens is None else rows.draft_tokens[s]
        values = None if rows.draft_values is None else rows.draft_values[self._upload(s)]
        return sample_rows(probs, drafts, RowDraws(rows, s, probs.device, self._upload), values)

    @staticmethod
    def _with_logprobs(logits: torch.Tensor, tokens: torch.Tensor, rows) -> Sampled:
        """The samples with the log-probs the rows asked for, from `logits` as sampled from."""
        k = int(rows.top_logprobs.max()) if len(rows.top_logprobs) else 0
        if not (k or rows.return_logprobs.any()):
            return Sampled(tokens.to(torch.int32), None, None, None)
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
        if not k:
            return Sampled(tokens.to(torch.int32), chosen, None, None)
        top = logprobs.topk(k, dim=-1)
        return Sampled(tokens.to(torch.int32), chosen, top.indices.to(torch.int32), top.values)

    def _apply_bias(self, logits: torch.Tensor, rows) -> torch.Tensor:
        """logits + each row's logit_bias (ids past the vocabulary are ignored)."""
        lens = rows.bias_lens
        if not lens.any():
            return logits
        r = np.repeat(np.arange(len(lens)), lens)
        j = np.concatenate([np.arange(a, a + m) for a, m in zip(rows.bias_starts, lens) if m])
        t = rows.bias_tokens[j]
        keep = (t >= 0) & (t < logits.shape[1])
        r, t, v = r[keep], t[keep].astype(np.int64), rows.bias_values[j][keep].astype(np.float32)
        return logits.index_put((self._upload(r.astype(np.int64)), self._upload(t)), self._upload(v), accumulate=True)

    def _apply_forced(self, logits: torch.Tensor, rows) -> torch.Tensor:
        """Rows with a forced token (>= 0) can sample only it."""
        f = np.nonzero(rows.forced_tokens >= 0)[0]
        if not len(f):
            return logits
        fi = self._upload(f)
        only = torch.full((len(f), logits.shape[1]), _MASK, dtype=logits.dtype, device=logits.device)
        only[torch.arange(len(f), device=logits.device), self._upload(rows.forced_tokens[f].astype(np.int64))] = 0.0
        return logits.index_copy(0, fi, only)

    def _apply_penalties(self, logits, rows) -> torch.Tensor:
        active = np.nonzero((rows.repetition_penalty != 1.0) | (rows.presence_penalty != 0.0)
                            | (rows.frequency_penalty != 0.0) | (rows.no_repeat_ngram_size > 0))[0]
        if not len(active):
            return logits
        logits = logits.clone()
        for r in active:
            start, n = int(rows.history_starts[r]), int(rows.history_lens[r])
            seq = torch.as_tensor(rows.history_tokens[start:start + n].astype(np.int64), device=logits.device)
            prompt_len = n - int(rows.num_generated[r])
            row = logits[r]
            if rows.repetition_penalty[r] != 1.0 and len(seq):  # HF: prompt and output tokens
                seen = torch.unique(seq)
                vals = row[seen]
                p = float(rows.repetition_penalty[r])
                row[seen] = torch.where(vals < 0, vals * p, vals / p)
            out = seq[prompt_len:]
            if len(out) and (rows.presence_penalty[r] != 0.0 or rows.frequency_penalty[r] != 0.0):
                counts = torch.bincount(out, minlength=row.shape[0]).to(row.dtype)
                row -= float(rows.frequency_penalty[r]) * counts + float(rows.presence_penalty[r]) * (counts > 0)
            if rows.no_repeat_ngram_size[r] > 0:
                banned = _repeated_ngram_ends(rows.history_tokens[start:start + n], int(rows.no_repeat_ngram_size[r]))
                banned = banned[banned < row.shape[0]]
                if len(banned):
                    row[torch.as_tensor(banned, device=logits.device)] = _MASK
        return logits

    def _probs(self, logits: torch.Tensor, rows, idx: np.ndarray) -> torch.Tensor:
        """Probabilities of rows idx from their tempered logits, truncated by top-k, top-p, min-p."""
        top_k = rows.top_k[idx]
        if (top_k > 0).any():
            k_host = np.minimum(np.where(top_k > 0, top_k, logits.shape[1]), logits.shape[1]).astype(np.int64)
            k = self._upload(k_host)
            kth = logits.topk(int(k_host.max()), dim=-1).values.gather(1, (k - 1)[:, None])
            logits = logits.masked_fill(logits < kth, _MASK)
        top_p = rows.top_p[idx]
        if (top_p < 1.0).any():
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            p = self._upload(top_p.astype(np.float32))[:, None]
            drop = cum - sorted_logits.softmax(dim=-1) > p  # keep the smallest prefix reaching p
            sorted_logits = sorted_logits.masked_fill(drop, _MASK)
            logits = torch.full_like(logits, _MASK).scatter(1, order, sorted_logits)
        probs = logits.softmax(dim=-1)
        min_p = rows.min_p[idx]
        if (min_p > 0).any():
            mp = self._upload(min_p.astype(np.float32))[:, None]
            probs = probs.masked_fill(probs < mp * probs.max(dim=-1, keepdim=True).values, 0.0)
        return probs
