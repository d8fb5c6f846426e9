"""Token sampling on the device: grammars' token masks, greedy, temperature, top-k, top-p,
min-p, repetition / presence / frequency penalties, and per-request seeds.

A seeded row draws from its own generator seeded by (seed, tokens generated so far), so its
samples do not depend on which other requests share the batch.

`rows` is a step batch's SamplingRows (StepBatch.rows: rtp_llm/ops/engine_core.py): every
sampling parameter and num_generated [N] of the rows sampled, named as in
rtp_llm/cpp/engine/step_batch_fields.h, and the penalized rows' token history (prompt, then
generated): history_tokens[history_starts[r] +: history_lens[r]]."""

from typing import Callable, Optional, Tuple

import numpy as np
import torch

from rtp_llm.device.base import apply_token_bitmask as torch_token_bitmask

_MASK = -float("inf")
# Temperatures below this sample greedily, the limit they tend to (vLLM's cut-off as well):
# dividing logits by, say, 1e-38 would overflow to inf and make the probabilities NaN.
_GREEDY_TEMPERATURE = 1e-5


def _seed(seed: int, step: int) -> int:
    return (int(seed) * 6364136223846793005 + int(step) * 1442695040888963407 + 1) & ((1 << 63) - 1)


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

    def _upload(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a))
        if self.pin_host:
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    @torch.inference_mode()
    def sample_on_device(self, logits: torch.Tensor, rows, mask=None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """logits: [N, V] fp32 (masked in place where `mask` says). mask: the grammar rows'
        token bitmask (async_decoder_engine.grammar.TokenBitmask), applied before penalties and
        temperature; None when no row has a grammar. Returns, left on the device and without
        waiting for it, (tokens [N] int32, log-prob of each under the model (unmasked) [N] fp32,
        or None when no row asked for them)."""
        n = logits.shape[0]
        want_logprobs = bool(rows.return_logprobs.any())
        logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        if mask is not None:
            self.apply_token_bitmask(logits, self._upload(mask.rows), mask.bits)
        logits = self._apply_penalties(logits, rows)
        greedy = (rows.temperature < _GREEDY_TEMPERATURE) | (rows.top_k == 1)
        tokens = torch.empty(n, dtype=torch.int64, device=logits.device)
        g = np.nonzero(greedy)[0]
        if len(g) == n:
            tokens = self.argmax(logits)
        elif len(g):
            gi = self._upload(g)
            tokens[gi] = self.argmax(logits[gi])
        s = np.nonzero(~greedy)[0]
        if len(s):
            si = self._upload(s)
            probs = self._probs(logits[si], rows, s)
            seeded = rows.random_seed[s] >= 0
            picked = torch.empty(len(s), dtype=torch.int64, device=logits.device)
            if (~seeded).any():
                u = self._upload(np.nonzero(~seeded)[0])
                picked[u] = torch.multinomial(probs[u], 1).squeeze(1)
            for j in np.nonzero(seeded)[0]:
                r = s[j]
                gen = torch.Generator(device=logits.device).manual_seed(_seed(rows.random_seed[r], rows.num_generated[r]))
                picked[j] = torch.multinomial(probs[j], 1, generator=gen)[0]
            tokens[si] = picked
        chosen = logprobs.gather(1, tokens[:, None]).squeeze(1) if want_logprobs else None
        return tokens.to(torch.int32), chosen

    def _apply_penalties(self, logits, rows) -> torch.Tensor:
        active = np.nonzero((rows.repetition_penalty != 1.0) | (rows.presence_penalty != 0.0)
                            | (rows.frequency_penalty != 0.0))[0]
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
        return logits

    def _probs(self, logits: torch.Tensor, rows, idx: np.ndarray) -> torch.Tensor:
        temp = self._upload(rows.temperature[idx].astype(np.float32))[:, None]
        logits = logits / temp
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
