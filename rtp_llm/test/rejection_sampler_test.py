"""Speculative decoding's rejection sampling keeps the plain sampler's distribution: many seeded
draws of rows verifying drafts (right, wrong, and ones the truncation excludes) against as many
plain draws, one position and whole 3-token continuations (drafts, first rejection, bonus token),
by a chi-square test of homogeneity and a total-variation bound; a general draft distribution q
(a future draft model) against the exact target; and the test's power (a residual that forgets
to remove the draft fails it). Seeded draws repeat run to run; greedy rows ignore drafts."""

import unittest
from collections import Counter

import numpy as np
import torch

from rtp_llm.models_py.rejection_sampler import accept_or_resample
from rtp_llm.models_py.sampler import Sampler
from rtp_llm.ops.engine_core import StepBatch
from rtp_llm.test.sampler_test import host, rows

N = 20000
Z = 3.72  # the normal quantile of the chi-square bound: 1e-4 one-sided


def chi_square_bound(dof: int) -> float:
    """The chi-square distribution's 1 - 1e-4 quantile (Wilson-Hilferty)."""
    return dof * (1 - 2 / (9 * dof) + Z * np.sqrt(2 / (9 * dof))) ** 3


def homogeneity(a: Counter, b: Counter):
    """(statistic, degrees of freedom, total variation) of two equal-sized samples' counts: cells
    with fewer than 10 draws in both together are pooled (the chi-square approximation)."""
    cells = sorted(set(a) | set(b), key=repr)
    small = [c for c in cells if a[c] + b[c] < 10]
    pairs = [(a[c], b[c]) for c in cells if c not in small] + [(sum(a[c] for c in small), sum(b[c] for c in small))]
    pairs = [(x, y) for x, y in pairs if x + y]
    stat = sum((x - y) ** 2 / (x + y) for x, y in pairs)
    tv = 0.5 * sum(abs(a[c] - b[c]) for c in cells) / sum(a.values())
    return stat, len(pairs) - 1, tv


def goodness_of_fit(tokens: np.ndarray, p: np.ndarray):
    """(statistic, degrees of freedom) of draws `tokens` against probabilities p (cells expecting
    fewer than 5 pooled; a draw outside p's support fails it outright: inf)."""
    counts = np.bincount(tokens, minlength=len(p)).astype(float)
    if counts[p == 0].sum():
        return float("inf"), 1
    expected = p * len(tokens)
    big = expected >= 5
    obs, exp = np.r_[counts[big], counts[~big].sum()], np.r_[expected[big], expected[~big].sum()]
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


class RejectionSamplerTest(unittest.TestCase):
    def setUp(self):
        self.s = Sampler(torch.device("cpu"))
        self.logits = torch.log(torch.tensor([0.35, 0.25, 0.2, 0.1, 0.07, 0.03]))

    def assert_same_distribution(self, a: Counter, b: Counter, what):
        stat, dof, tv = homogeneity(a, b)
        self.assertLess(stat, chi_square_bound(max(dof, 1)), (what, a, b))
        self.assertLess(tv, 0.03, (what, a, b))

    def draws(self, params, drafts=None, seeded=True, positions=None):
        """N draws of one position from self.logits under `params` (rows() keywords of one row),
        verifying drafts [N] (None: plain); seeded: row i with seed i (else torch's generator,
        batched: fast). positions: num_generated [N] (default 0)."""
        r = rows(N, **{k: [v] * N for k, v in params.items()}, random_seed=np.arange(N) if seeded else np.full(N, -1),
                 num_generated=np.zeros(N) if positions is None else positions)
        if drafts is not None:
            r.draft_tokens = np.asarray(drafts, np.int32)
        return host(self.s.sample_on_device(self.logits.repeat(N, 1), r).tokens)

    def test_one_position_matches_the_plain_sampler(self):
        # Drafts: the likeliest token, the rarest (excluded by top-k / top-p / min-p where those
        # apply: always rejected), and a mix of them with a middling one. The seeded speculative
        # draws against the plain sampler's unseeded ones (independent of them).
        torch.manual_seed(0)
        mix = np.random.default_rng(0).choice([0, 2, 5], N)
        for params in ({"temperature": 0.7}, {"temperature": 1.3, "top_k": 3}, {"top_p": 0.75},
                       {"temperature": 1.5, "min_p": 0.2}):
            plain = Counter(self.draws(params, seeded=False).tolist())
            for drafts in (np.zeros(N), np.full(N, 5), mix):
                spec = self.draws(params, drafts)
                self.assert_same_distribution(Counter(spec.tolist()), plain, (params, drafts[:3]))

    def test_seeded_draws_repeat_and_differ_by_position(self):
        drafts = np.full(N, 1)
        a = self.draws({"temperature": 0.9}, drafts)
        np.testing.assert_array_equal(a, self.draws({"temperature": 0.9}, drafts))
        b = self.draws({"temperature": 0.9}, drafts, positions=np.ones(N))
        self.assertGreater((a != b).mean(), 0.3)  # another position: other draws

    def test_greedy_rows_ignore_drafts(self):
        r = rows(3, temperature=[0, 0, 1], top_k=[0, 1, 1])
        r.draft_tokens = np.array([3, 1, 2], np.int32)
        tokens = host(self.s.sample_on_device(self.logits.repeat(3, 1), r).tokens)
        self.assertEqual(tokens.tolist(), [0, 0, 0])

    def test_a_draft_distribution_q_keeps_the_target(self):
        """A draft model's case: drafts drawn from q, kept with min(1, p/q), else max(p - q, 0)."""
        g = torch.Generator().manual_seed(3)
        p = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
        q = torch.tensor([0.1, 0.2, 0.3, 0.2, 0.2])  # puts weight where p has none
        d = torch.multinomial(q, N, replacement=True, generator=g)
        u = torch.rand(N, generator=g)
        x = accept_or_resample(p.repeat(N, 1), d, u, lambda w: torch.multinomial(w, 1, generator=g).squeeze(1),
                               q.repeat(N, 1))
        stat, dof = goodness_of_fit(x.numpy(), p.numpy())
        self.assertLess(stat, chi_square_bound(dof))

    def test_the_test_catches_a_residual_that_keeps_the_draft(self):
        """Resampling from p instead of p without the draft overweights the draft (p(d) = 0.35 ->
        0.58): the goodness-of-fit bound must reject it."""
        g = torch.Generator().manual_seed(4)
        p = self.logits.softmax(-1)
        u = torch.rand(N, generator=g)
        wrong = accept_or_resample(p.repeat(N, 1), torch.zeros(N, dtype=torch.int64), u,
                                   lambda w: torch.multinomial(p.repeat(N, 1), 1, generator=g).squeeze(1))
        stat, dof = goodness_of_fit(wrong.numpy(), p.numpy())
        self.assertGreater(stat, chi_square_bound(dof))


class ContinuationTest(unittest.TestCase):
    """A toy model (next-token logits from the last token: table T [V, V]) decoded 3 tokens at a
    time from token 0, plainly and with 2 drafts per step from a drafter that guesses the
    likeliest token after the last, then the one after the likeliest token's likeliest: right
    and wrong alike. Kept tokens as the core keeps them
    (Scheduler::append_samples): drafts while the sample equals them, then the sample."""

    V, L, K = 4, 3, 2

    def setUp(self):
        self.s = Sampler(torch.device("cpu"))
        self.table = torch.randn(self.V, self.V, generator=torch.Generator().manual_seed(5))
        self.params = {"temperature": 0.9, "top_p": 0.9}
        best = self.table.argmax(-1).tolist()
        self.guess = lambda last, j: best[last] if j == 0 else (best[last] + 1) % self.V  # (draft j after `last`)

    def run_round(self, lasts, drafts, generated, seeds):
        """One step over streams with last tokens `lasts`, drafts (lists) and generated counts:
        the sampled tokens, per stream (1 + len(drafts) each)."""
        logit_rows, draft_tokens, positions, row_seeds = [], [], [], []
        for last, ds, n, seed in zip(lasts, drafts, generated, seeds):
            logit_rows += [last] + ds
            draft_tokens += ds + [-1]
            positions += list(range(n, n + len(ds) + 1))
            row_seeds += [seed] * (len(ds) + 1)
        m = len(logit_rows)
        r = rows(m, **{k: [v] * m for k, v in self.params.items()}, random_seed=row_seeds, num_generated=positions)
        r.draft_tokens = np.asarray(draft_tokens, np.int32) if any(drafts) else None
        tokens = host(self.s.sample_on_device(self.table[logit_rows], r).tokens).tolist()
        out, at = [], 0
        for ds in drafts:
            out.append(tokens[at:at + len(ds) + 1])
            at += len(ds) + 1
        return out

    def draft(self, last, n):
        out = []
        for j in range(n):
            out.append(self.guess(out[-1] if out else last, j))
        return out

    def decode(self, seeds, k):
        """Each stream's 3 tokens, with up to k drafts a step; and (accepted, drafted) counts."""
        gen = [[] for _ in seeds]
        accepted = drafted = 0
        while any(len(g) < self.L for g in gen):
            live = [i for i, g in enumerate(gen) if len(g) < self.L]
            lasts = [gen[i][-1] if gen[i] else 0 for i in live]
            drafts = [self.draft(last, min(k, self.L - len(gen[i]) - 1)) for i, last in zip(live, lasts)]
            samples = self.run_round(lasts, drafts, [len(gen[i]) for i in live], [seeds[i] for i in live])
            for i, ds, xs in zip(live, drafts, samples):
                a = 0
                while a < len(ds) and xs[a] == ds[a]:
                    a += 1
                gen[i] += xs[:a + 1]
                accepted, drafted = accepted + a, drafted + len(ds)
        return [tuple(g) for g in gen], accepted, drafted

    def test_continuations_match_the_plain_sampler(self):
        for seeded in (True, False):
            with self.subTest(seeded=seeded):
                torch.manual_seed(6)
                spec_seeds = list(range(N)) if seeded else [-1] * N
                plain_seeds = list(range(N, 2 * N)) if seeded else [-1] * N
                spec, accepted, drafted = self.decode(spec_seeds, self.K)
                plain, _, _ = self.decode(plain_seeds, 0)
                self.assertTrue(0 < accepted < drafted, (accepted, drafted))
                stat, dof, tv = homogeneity(Counter(spec), Counter(plain))
                self.assertLess(stat, chi_square_bound(dof), (Counter(spec), Counter(plain)))
                self.assertLess(tv, 0.03)
                if seeded:  # run to run (the first 2000)
                    self.assertEqual(self.decode(spec_seeds[:2000], self.K)[0], spec[:2000])


class DraftPositionsTest(unittest.TestCase):
    """StepBatch.rows in a step with drafts (ops/draft_rows.py)."""

    def batch(self, history_lens):
        """Streams: 0 decodes with 2 drafts, 1 runs a prompt chunk (no sample), 2 decodes plainly;
        histories (prompt, then generated) [1, 2, 10] and [3, 30] where history_lens says."""
        arrays = dict(do_sample=np.array([1, 0, 1], np.int32), draft_lens=np.array([2, 0, 0], np.int32),
                      query_starts=np.array([0, 3, 7, 8], np.int32),
                      token_ids=np.array([10, 11, 12, 20, 21, 22, 23, 30], np.int32),
                      num_generated=np.array([5, 0, 9], np.int32), history_starts=np.array([0, 3, 3], np.int32),
                      history_lens=np.asarray(history_lens, np.int32),
                      history_tokens=np.array([1, 2, 10, 3, 30], np.int32))
        spec = (("num_generated", True), ("history_starts", True), ("history_lens", True), ("history_tokens", False))
        return StepBatch(spec, {"num_draft_tokens": 2}, arrays)

    def test_rows_name_their_draft_and_position(self):
        b = self.batch([0, 0, 0])
        streams = b.sampled_streams()
        self.assertEqual(streams.tolist(), [0, 0, 0, 2])
        r = b.rows(streams)
        self.assertEqual(r.draft_tokens.tolist(), [11, 12, -1, -1])
        self.assertEqual(r.num_generated.tolist(), [5, 6, 7, 9])
        self.assertIsNone(b.rows(b.do_sample == 1).draft_tokens)

    def test_penalized_rows_count_the_drafts_before_them(self):
        b = self.batch([3, 0, 2])
        r = b.rows(b.sampled_streams())
        history = [r.history_tokens[s:s + n].tolist() for s, n in zip(r.history_starts, r.history_lens)]
        self.assertEqual(history, [[1, 2, 10], [1, 2, 10, 11], [1, 2, 10, 11, 12], [3, 30]])
        self.assertEqual(b.history_tokens.tolist(), [1, 2, 10, 3, 30])  # the batch's own arrays untouched


if __name__ == "__main__":
    unittest.main()
