"""greedy_ties: a difference at a near-tie passes, any other fails naming the position."""

import unittest

import torch

from rtp_llm.test.greedy_ties import first_real_mismatch


def logprobs_with(gaps):
    """A stand-in for HF's log-probs: at the last position token 1 has log-prob -1 and token 2
    sits gaps[len(ids)] below it."""
    def fn(_hf, ids):
        lp = torch.full((len(ids), 4), -9.0)
        lp[-1, 1] = -1.0
        lp[-1, 2] = -1.0 - gaps[len(ids)]
        return lp
    return fn


class GreedyTiesTest(unittest.TestCase):
    def test_equal_tokens_pass(self):
        self.assertIsNone(first_real_mismatch(None, [0], [1, 1, 3], [1, 1, 3], logprobs_with({})))

    def test_a_difference_at_a_near_tie_passes_and_ends_the_comparison(self):
        # prompt [0] + ref[:2] = 3 ids: the tokens differ at position 2, 7e-6 apart
        self.assertIsNone(first_real_mismatch(None, [0], [1, 1, 2, 0], [1, 1, 1, 3], logprobs_with({3: 7e-6})))

    def test_a_decisive_difference_fails_naming_it(self):
        why = first_real_mismatch(None, [0], [1, 2, 3], [1, 1, 3], logprobs_with({2: 0.5}))
        self.assertIn("token 1: ours 2", why)
        self.assertIn("not a tie", why)

    def test_a_short_answer_fails(self):
        self.assertIn("2 tokens against HF's 3", first_real_mismatch(None, [0], [1, 1], [1, 1, 3], logprobs_with({})))


if __name__ == "__main__":
    unittest.main()
