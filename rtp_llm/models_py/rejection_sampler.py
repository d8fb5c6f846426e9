"""Speculative decoding's rejection sampling (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding"; vLLM's RejectionSampler), and the per-row random draws
that it and the plain sampler share.

A verify step samples, per drafting stream, the rows of its last token and its d drafts
(StepBatch.rows: draft_tokens[r] is the drafted token row r verifies, -1 on the row after the
last draft, the bonus row). Row r's target distribution p_r is the one the plain sampler would
draw from at that position (Sampler._probs: temperature, top-k, top-p, min-p), and the draft
was drawn from q_r (the prompt-lookup drafter's is a point mass on its token). Row r keeps

    x = d_r                                     with probability min(1, p_r(d_r) / q_r(d_r))
    x ~ max(p_r - q_r, 0) / sum(max(p_r - q_r, 0))  otherwise (the residual),

and the bonus row draws from p as the plain sampler does. The core (Scheduler::append_samples)
keeps the drafts while x_r == d_r and the row after the last kept one: the first rejection's
residual sample, or the bonus token after all d. The residual is 0 at d_r whenever d_r can be
rejected (p_r(d_r) < q_r(d_r)), so x_r == d_r exactly when the draft was accepted, and each
kept token is distributed as p at its position: the text has the plain sampler's distribution.

Every row draws its uniform and its residual token whatever the rows before it decided (their
results are dropped after the first rejection), so nothing waits for the device, and a seeded
row's draws depend on its seed and position only (RowDraws)."""

from typing import Callable, Dict, Optional

import numpy as np
import torch


def _seed(seed: int, step: int) -> int:
    return (int(seed) * 6364136223846793005 + int(step) * 1442695040888963407 + 1) & ((1 << 63) - 1)


class RowDraws:
    """Random draws for the sampled rows `s` (indices into `rows`). A seeded row (random_seed >= 0)
    draws from its own generator, seeded by (seed, num_generated: the index of the token it
    samples), so its draws do not depend on the batch; a row's draws come in a fixed order
    (uniform(), then categorical(): one generator each, created on first use). Unseeded rows
    draw from torch's global generator, batched."""

    def __init__(self, rows, s: np.ndarray, device: torch.device, upload: Callable[[np.ndarray], torch.Tensor]):
        self.seeds = rows.random_seed[s]
        self.steps = rows.num_generated[s]
        self.device, self.upload = device, upload
        self._gens: Dict[int, torch.Generator] = {}

    def _gen(self, j: int) -> torch.Generator:
        if j not in self._gens:
            self._gens[j] = torch.Generator(device=self.device).manual_seed(_seed(self.seeds[j], self.steps[j]))
        return self._gens[j]

    def _split(self, which: np.ndarray):
        """(positions in `which` of its unseeded rows, as a device index or None; of its seeded ones)."""
        seeded = self.seeds[which] >= 0
        u = np.nonzero(~seeded)[0]
        return (self.upload(u) if len(u) else None), np.nonzero(seeded)[0]

    def categorical(self, weights: torch.Tensor, which: np.ndarray) -> torch.Tensor:
        """One token per row of weights [len(which), V] (non-negative, each row's sum > 0; rows
        `which` of s) -> [len(which)] int64."""
        picked = torch.empty(len(which), dtype=torch.int64, device=weights.device)
        unseeded, seeded = self._split(which)
        if unseeded is not None:
            picked[unseeded] = torch.multinomial(weights[unseeded], 1).squeeze(1)
        for i in seeded:
            picked[i] = torch.multinomial(weights[i], 1, generator=self._gen(int(which[i])))[0]
        return picked

    def uniform(self, which: np.ndarray) -> torch.Tensor:
        """One draw from U[0, 1) per row of `which` -> [len(which)] fp32."""
        u = torch.empty(len(which), dtype=torch.float32, device=self.device)
        unseeded, seeded = self._split(which)
        if unseeded is not None:
            u[unseeded] = torch.rand(len(unseeded), device=self.device)
        for i in seeded:
            u[i] = torch.rand(1, generator=self._gen(int(which[i])), device=self.device)[0]
        return u


def accept_or_resample(p: torch.Tensor, drafts: torch.Tensor, uniform: torch.Tensor,
                       residual_draw: Callable[[torch.Tensor], torch.Tensor],
                       q: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The token each row keeps at a drafted position: its draft where accepted, else a draw from
    the residual. p: [R, V] target weights (normalized here: min-p leaves them unnormalized).
    drafts: [R] int64. uniform: [R] fp32 in [0, 1). residual_draw: [R, V] weights -> [R] int64.
    q: [R, V] the drafter's distributions, each with q[r, drafts[r]] > 0 (the draft was drawn
    from it); None: point masses on the drafts (prompt lookup). -> [R] int64."""
    p = p / p.sum(dim=-1, keepdim=True)
    d = drafts[:, None]
    if q is None:
        q = torch.zeros_like(p).scatter_(1, d, 1.0)
    p_d, q_d = p.gather(1, d).squeeze(1), q.gather(1, d).squeeze(1)
    accepted = uniform * q_d < p_d  # u < p(d) / q(d), without dividing
    residual = (p - q).clamp_min(0.0)
    # A row whose residual is empty (p <= q everywhere: p == q) always accepts (p(d) == q(d) > u);
    # its draw is unused but must be from valid weights.
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    resampled = residual_draw(torch.where(empty, p, residual))
    return torch.where(accepted, drafts, resampled)


def sample_rows(probs: torch.Tensor, drafts: Optional[np.ndarray], draws: RowDraws,
                values: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The tokens of sampled rows with target weights probs [R, V] (Sampler._probs): rows with a
    draft (drafts[r] >= 0; drafts None: none has) go through accept_or_resample, the others
    (bonus rows, streams without drafts) draw from probs. values: the drafts [R] on the device
    where the drafter left them there (then drafts only says which rows have one). -> [R] int64."""
    everyone = np.arange(probs.shape[0])
    if drafts is None or not (drafts >= 0).any():
        return draws.categorical(probs, everyone)
    v, b = np.nonzero(drafts >= 0)[0], np.nonzero(drafts < 0)[0]
    out = torch.empty(probs.shape[0], dtype=torch.int64, device=probs.device)
    if len(b):
        out[draws.upload(b)] = draws.categorical(probs[draws.upload(b)], b)
    vi = draws.upload(v)
    u = draws.uniform(v)  # (a seeded row's uniform comes before its residual draw)
    proposed = values[vi] if values is not None else draws.upload(drafts[v].astype(np.int64))
    out[vi] = accept_or_resample(probs[vi], proposed, u,
                                 lambda w: draws.categorical(w, v))
    return out
