"""The sampler's semantics on hand-made logits: greedy (also for vanishing temperatures),
top-k / top-p / min-p masks, HF's penalties, logit_bias, forced tokens, per-request seeds
independent of the batch, and log-probs (with alternatives) only when asked for, from the
distribution sampled from."""

import unittest

import numpy as np
import torch

from rtp_llm.models_py.sampler import Sampler
from rtp_llm.ops.engine_core import SamplingRows


def rows(n, **kw):
    """n rows as a step batch's StepBatch.rows() gives them; no history unless given."""
    base = dict(temperature=np.ones(n, np.float32), top_k=np.zeros(n, np.int32),
                top_p=np.ones(n, np.float32), min_p=np.zeros(n, np.float32),
                repetition_penalty=np.ones(n, np.float32), presence_penalty=np.zeros(n, np.float32),
                frequency_penalty=np.zeros(n, np.float32), random_seed=np.full(n, -1, np.int64),
                num_generated=np.zeros(n, np.int32), return_logprobs=np.zeros(n, np.int32),
                grammar=np.zeros(n, np.int32),
                history_starts=np.zeros(n, np.int32), history_lens=np.zeros(n, np.int32),
                history_tokens=np.zeros(0, np.int32), top_logprobs=np.zeros(n, np.int32),
                bias_starts=np.zeros(n, np.int32), bias_lens=np.zeros(n, np.int32),
                bias_tokens=np.zeros(0, np.int32), bias_values=np.zeros(0, np.float32),
                forced_tokens=np.full(n, -1, np.int32), no_repeat_ngram_size=np.zeros(n, np.int32))
    for k, v in kw.items():
        base[k] = np.asarray(v, dtype=base[k].dtype)
    return SamplingRows(**base)


def host(t):
    return None if t is None else t.cpu().numpy()


def sample(sampler, logits, r, mask=None):
    """The real path (sample_on_device), brought to the host: (tokens, log-probs or None)."""
    out = sampler.sample_on_device(logits, r, mask)
    return host(out.tokens), host(out.logprobs)


def bias(*entries):
    """rows() arguments for per-row logit_bias dicts."""
    lens = [len(e) for e in entries]
    return dict(bias_starts=np.cumsum([0] + lens[:-1]), bias_lens=lens,
                bias_tokens=[t for e in entries for t in e], bias_values=[v for e in entries for v in e.values()])


class SamplerTest(unittest.TestCase):
    def setUp(self):
        self.s = Sampler(torch.device("cpu"))
        self.logits = torch.tensor([[1.0, 3.0, 2.0, -1.0], [0.5, 0.1, 0.2, 4.0]])

    def test_greedy_and_vanishing_temperature_pick_the_argmax(self):
        for t in (0.0, 1.175494351e-38, 1e-6):
            tokens, _ = sample(self.s, self.logits, rows(2, temperature=[t, t]))
            self.assertEqual(tokens.tolist(), [1, 3], t)

    def test_masks_bound_what_can_be_drawn(self):
        logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(200, 1)
        for kw, allowed in ((dict(top_k=[2] * 200), {0, 1}), (dict(top_p=[0.7] * 200), {0, 1}),
                            (dict(min_p=[0.4] * 200), {0, 1})):
            tokens, _ = sample(self.s, logits, rows(200, **kw))
            self.assertLessEqual(set(tokens.tolist()), allowed, kw)
            self.assertEqual(set(tokens.tolist()), allowed, kw)  # and both are drawn in 200 tries

    def test_penalties_follow_hf(self):
        history = dict(history_tokens=[1, 1, 2], history_lens=[3], num_generated=[2])  # prompt [1], generated [1, 2]
        logits = torch.tensor([[1.0, 3.0, 2.9, 0.0]])
        # repetition 2: seen tokens 1 and 2 -> 1.5 and 1.45; token 0 (1.0) stays below them
        tokens, _ = sample(self.s, logits, rows(1, temperature=[0], repetition_penalty=[2.0], **history))
        self.assertEqual(tokens.tolist(), [1])
        # frequency 1: generated counts {1: 1, 2: 1} -> 2.0, 1.9; presence 1.5 more -> 0.5, 0.4
        tokens, _ = sample(self.s, logits, rows(1, temperature=[0], frequency_penalty=[1.0],
                                                presence_penalty=[1.5], **history))
        self.assertEqual(tokens.tolist(), [0])

    def test_a_seed_draws_the_same_whatever_the_batch(self):
        logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
        alone, _ = sample(self.s, logits[2:], rows(1, random_seed=[7], num_generated=[4]))
        crowd, _ = sample(self.s, logits, rows(3, random_seed=[-1, 3, 7], num_generated=[0, 1, 4]))
        self.assertEqual(crowd[2], alone[0])

    def test_logprobs_only_when_asked(self):
        _, lp = sample(self.s, self.logits, rows(2, temperature=[0, 0]))
        self.assertIsNone(lp)  # not computed (the model runner commits zeros)
        _, lp = sample(self.s, self.logits, rows(2, temperature=[0, 0], return_logprobs=[1, 0]))
        want = torch.log_softmax(self.logits, -1)[[0, 1], [1, 3]]
        np.testing.assert_allclose(lp, want.numpy(), rtol=1e-6)


    def test_alternatives_are_the_tempered_distributions_best(self):
        logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
        r = rows(3, temperature=[0, 2.0, 1.0], top_logprobs=[3, 5, 0], top_k=[0, 4, 0], random_seed=[-1, 1, 2])
        out = self.s.sample_on_device(logits, r)
        self.assertEqual(tuple(out.top_ids.shape), (3, 5))  # the rows' largest top_logprobs
        # greedy: the model's distribution; sampled: logits / temperature, before top-k's mask
        want = torch.log_softmax(torch.stack([logits[0], logits[1] / 2.0, logits[2]]), -1)
        top = want.topk(5, dim=-1)
        np.testing.assert_array_equal(host(out.top_ids), top.indices.numpy())
        np.testing.assert_allclose(host(out.top_logprobs), top.values.numpy(), rtol=1e-6)
        chosen = want.gather(1, out.tokens.long()[:, None]).squeeze(1)
        np.testing.assert_allclose(host(out.logprobs), chosen.numpy(), rtol=1e-6)
        self.assertEqual(int(out.tokens[0]), int(logits[0].argmax()))

    def test_penalties_shape_the_logprobs(self):
        logits = torch.tensor([[1.0, 3.0, 2.9, 0.0]])
        r = rows(1, temperature=[0], frequency_penalty=[1.0], top_logprobs=[2], history_tokens=[1, 1, 2],
                 history_lens=[3], num_generated=[2])
        out = self.s.sample_on_device(logits, r)
        want = torch.log_softmax(torch.tensor([[1.0, 2.0, 1.9, 0.0]]), -1)
        np.testing.assert_allclose(host(out.top_logprobs)[0], want[0, [1, 2]].numpy(), rtol=1e-6)

    def test_logit_bias_forces_and_bans(self):
        logits = self.logits.repeat(2, 1)
        r = rows(4, temperature=[0, 1, 0, 0], random_seed=[-1, 5, -1, -1], top_logprobs=[1, 0, 0, 0],
                 **bias({2: 100.0}, {0: 100.0}, {1: -100.0, 3: -100.0}, {}))
        tokens, _ = sample(self.s, logits, r)
        self.assertEqual(tokens.tolist(), [2, 0, 2, 3])
        out = self.s.sample_on_device(logits, r)
        self.assertAlmostEqual(float(out.logprobs[0]), 0.0, places=4)  # the biased distribution's

    def test_logit_bias_past_the_vocabulary_is_ignored(self):
        tokens, _ = sample(self.s, self.logits, rows(2, temperature=[0, 0], **bias({4: 100.0, 0: 100.0}, {99: 5.0})))
        self.assertEqual(tokens.tolist(), [0, 3])

    def test_no_repeat_ngram_bans_what_would_repeat_one(self):
        logits = torch.tensor([[1.0, 3.0, 2.9, 0.0]])  # best first: 1, 2, 0, 3

        def greedy(history, n):
            h = dict(history_tokens=history, history_lens=[len(history)], num_generated=[1])
            return sample(self.s, logits, rows(1, temperature=[0], no_repeat_ngram_size=[n], **h))[0].tolist()

        self.assertEqual(greedy([1, 2, 3, 1], 2), [1])  # after a 1 only 2 is banned: (1, 2) occurred
        self.assertEqual(greedy([1, 1, 2, 1], 2), [0])  # (1, 1) and (1, 2) occurred
        self.assertEqual(greedy([1, 1, 2, 1], 3), [1])  # no 3-gram starts with (2, 1)
        self.assertEqual(greedy([1, 2, 3, 1], 1), [0])  # unigrams: every token seen

    def test_forced_token_is_the_only_choice(self):
        logits = self.logits.repeat(50, 1)
        r = rows(100, temperature=np.r_[np.zeros(50), np.ones(50)], forced_tokens=[3] * 100, return_logprobs=[1] * 100)
        tokens, lp = sample(self.s, logits, r)
        self.assertEqual(set(tokens.tolist()), {3})
        np.testing.assert_allclose(lp, 0.0, atol=1e-6)


def bitmask(allowed_per_row, vocab):
    """xgrammar's layout: [G, ceil(V/32)] int32, bit j of word w allows token 32 w + j."""
    words = np.zeros((len(allowed_per_row), -(-vocab // 32)), dtype=np.uint32)
    for i, allowed in enumerate(allowed_per_row):
        for t in allowed:
            words[i, t // 32] |= np.uint32(1) << np.uint32(t % 32)
    return torch.from_numpy(words.view(np.int32))


class TokenBitmaskTest(unittest.TestCase):
    """Grammar rows' logits keep only their allowed tokens, before penalties and temperature;
    other rows are untouched; log-probs are those of the masked distribution sampled from."""

    def test_masked_rows_sample_only_allowed_tokens_and_others_are_untouched(self):
        from rtp_llm.async_decoder_engine.grammar import TokenBitmask

        vocab = 70  # not a multiple of 32: the last word is partly padding
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(3, vocab, generator=g) * 5
        allowed = [[31, 63, 69], [0, 32]]  # bit 31 is the sign bit of its word
        mask = TokenBitmask(torch.tensor([0, 2]), bitmask(allowed, vocab))
        before = logits.clone()
        s = Sampler(torch.device("cpu"))
        tokens, _ = sample(s, logits.clone(), rows(3, temperature=[0, 0, 0]), mask)
        self.assertEqual(tokens[0], max(allowed[0], key=lambda t: before[0, t]))
        self.assertEqual(tokens[1], int(before[1].argmax()))
        self.assertEqual(tokens[2], max(allowed[1], key=lambda t: before[2, t]))
        for _ in range(20):  # temperature 1 with a penalty: still only the allowed tokens
            r = rows(3, presence_penalty=[1.0, 0, 0], num_generated=[1, 0, 0], history_starts=[0, 1, 1],
                     history_lens=[2, 0, 0], history_tokens=[5, 31])
            tokens, logprobs = sample(s, before.clone(), r, mask)
            self.assertIn(tokens[0], allowed[0])
            self.assertIn(tokens[2], allowed[1])
        m = before.clone()
        Sampler(torch.device("cpu")).apply_token_bitmask(m, mask.rows, mask.bits)
        self.assertTrue(torch.equal(m[1], before[1]))
        self.assertEqual(set(torch.nonzero(torch.isfinite(m[0])).flatten().tolist()), set(allowed[0]))

    def test_log_probs_are_the_masked_distribution_s(self):
        from rtp_llm.async_decoder_engine.grammar import TokenBitmask

        logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
        mask = TokenBitmask(torch.tensor([0]), bitmask([[2]], 4))
        tokens, logprobs = sample(Sampler(torch.device("cpu")), logits.clone(),
                                  rows(1, temperature=[0], return_logprobs=[1]), mask)
        self.assertEqual(tokens[0], 2)
        self.assertAlmostEqual(float(logprobs[0]), 0.0, places=5)  # the one token the grammar allows


if __name__ == "__main__":
    unittest.main()
