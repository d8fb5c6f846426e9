"""Speculative decoding with a draft model (--sp_type=vanilla, async_decoder_engine/draft_model.py)
on the tiny fixtures: the greedy text is the plain engine's whatever the draft; a draft equal to
the target has every draft accepted (its mirrored KV cache is right: any stale slot would show
as a rejected draft) with chunked prefill, the prefix cache, stop words and overlap scheduling;
rows sampled with a seed repeat their text; a draft whose vocabulary is larger than the target's
is refused by flag name. The proposal steps' batches and the benchmark-only forced acceptance
are checked on their own."""

import tempfile
import unittest
from types import SimpleNamespace

import numpy as np
import torch

from rtp_llm.async_decoder_engine.draft_model import Proposals, check_draft, force_acceptance, mirror_batch
from rtp_llm.config.speculative import SpeculativeConfig
from rtp_llm.llm import LLM
from rtp_llm.test.testlib import make_loopy, make_tiny, repetitive_prompts

NEW_TOKENS = 48
GREEDY = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}


class DraftModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.loopy = make_loopy(cls.tmp.name)
        cls.other = make_tiny("qwen3_gqa_untied", cls.tmp.name)  # same vocabulary, unrelated weights
        cls.sharp = make_loopy(cls.tmp.name, "sharp", logit_scale=4.0)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_engine(self, target, batches, config, draft=None, **engine_args):
        spec = SpeculativeConfig("vanilla", 4, sp_checkpoint_path=draft) if draft else SpeculativeConfig()
        llm = LLM(target, act_type="fp32", progress=False, max_seq_len=256, speculative=spec, **engine_args)
        try:
            return [llm.generate(b, config) for b in batches], llm.engine.core.stats()
        finally:
            llm.close()

    def assert_same_text(self, plain, spec):
        for outs_plain, outs_spec in zip(plain, spec):
            for a, b in zip(outs_plain, outs_spec):
                self.assertEqual(b.outputs[0].token_ids, a.outputs[0].token_ids)
                self.assertEqual(b.outputs[0].finish_reason, a.outputs[0].finish_reason)

    @staticmethod
    def steps(outs):
        return sum(o.aux_info["iter_count"] for batch in outs for o in batch)

    def test_greedy_text_is_the_plain_engines_whatever_the_draft(self):
        prompts = repetitive_prompts()
        plain, _ = self.run_engine(self.loopy, [prompts], GREEDY)
        same, stats = self.run_engine(self.loopy, [prompts], GREEDY, draft=self.loopy)
        self.assert_same_text(plain, same)
        self.assertGreater(stats["spec_draft_tokens"], 0)
        self.assertEqual(stats["spec_accepted_tokens"], stats["spec_draft_tokens"], stats)
        self.assertLess(self.steps(same) * 3, self.steps(plain), (self.steps(same), self.steps(plain)))
        other, stats = self.run_engine(self.loopy, [prompts], GREEDY, draft=self.other)
        self.assert_same_text(plain, other)
        self.assertGreater(stats["spec_draft_tokens"], stats["spec_accepted_tokens"], stats)
        self.assertEqual(stats["used_blocks"], 0)

    def test_chunked_prefill_prefix_cache_stop_words_and_overlap(self):
        prompts = repetitive_prompts()
        plain, _ = self.run_engine(self.loopy, [prompts[:1]], GREEDY)
        out = plain[0][0].outputs[0].token_ids
        stop = {**GREEDY, "stop_words_list": [out[20:22]]}
        for engine_args in ({"max_num_batched_tokens": 16}, {"overlap_schedule": True}):
            with self.subTest(**engine_args):
                # The second batch repeats the first's prompts: their full blocks come from the prefix
                # cache, and the draft's mirrored blocks with them.
                plain, _ = self.run_engine(self.loopy, [prompts, prompts], stop, **engine_args)
                spec, stats = self.run_engine(self.loopy, [prompts, prompts], stop, draft=self.loopy, **engine_args)
                self.assert_same_text(plain, spec)
                self.assertTrue(any(o.aux_info["reuse_len"] > 0 for o in spec[1]), [o.aux_info for o in spec[1]])
                self.assertGreater(stats["spec_draft_tokens"], 0)
                self.assertEqual(stats["spec_accepted_tokens"], stats["spec_draft_tokens"], stats)
                self.assertEqual(stats["used_blocks"], 0)

    def test_sampled_rows_repeat_their_seeded_text(self):
        config = {"max_new_tokens": NEW_TOKENS, "temperature": 0.8, "top_p": 0.9, "random_seed": 5, "ignore_eos": True}
        prompts = repetitive_prompts()
        spec, stats = self.run_engine(self.sharp, [prompts], config, draft=self.sharp)
        again, _ = self.run_engine(self.sharp, [prompts], config, draft=self.sharp)
        self.assert_same_text(spec, again)
        for o in spec[0]:
            self.assertEqual(len(o.outputs[0].token_ids), NEW_TOKENS)
        self.assertGreater(stats["spec_accepted_tokens"], 0, stats)

    def test_a_draft_model_that_cannot_serve_is_refused_by_flag(self):
        with self.assertRaisesRegex(ValueError, "--sp_checkpoint_path"):
            SpeculativeConfig("vanilla", 4).validate()
        with self.assertRaisesRegex(ValueError, "--sp_checkpoint_path /d: the draft model's vocabulary"):
            check_draft(SimpleNamespace(vocab_size=512), SimpleNamespace(vocab_size=600), "/d")
        check_draft(SimpleNamespace(vocab_size=512), SimpleNamespace(vocab_size=500), "/d")

    def test_proposal_steps_follow_each_streams_reserved_positions(self):
        # Three streams: a prompt chunk (no drafts), a decode with 2 drafts, a decode with 3 whose
        # last round's last draft (token 59, position 19) was accepted without the draft running it.
        b = SimpleNamespace(
            stream_ids=np.array([7, 8, 9], np.int64), draft_lens=np.array([0, 2, 3], np.int32),
            query_lens=np.array([4, 3, 4], np.int32), query_starts=np.array([0, 4, 7, 11], np.int32),
            prefix_lens=np.array([0, 9, 20], np.int32), context_lens=np.array([4, 12, 24], np.int32),
            token_ids=np.array([1, 2, 3, 4, 50, 50, 50, 60, 60, 60, 60], np.int32),
            positions=np.array([0, 1, 2, 3, 9, 10, 11, 20, 21, 22, 23], np.int32),
            slot_mapping=np.arange(100, 111, dtype=np.int64), block_tables=np.array([[1, 0], [2, 3], [4, 5]], np.int32))
        seen = {8: (9, -1), 9: (19, 59)}
        p = Proposals(b, seen, block_size=16)
        self.assertEqual(p.steps, 3)
        s0, s1, s2 = p.batch(0), p.batch(1), p.batch(2)
        np.testing.assert_array_equal(s0.token_ids, [50, 59, 60])  # the last known tokens, the unseen one first
        np.testing.assert_array_equal(s0.positions, [9, 19, 20])
        np.testing.assert_array_equal(s0.slot_mapping, [104, 5 * 16 + 3, 107])  # position 19: its 2nd block (5), offset 3
        np.testing.assert_array_equal(s0.query_lens, [1, 2])
        np.testing.assert_array_equal(s0.context_lens, [10, 21])
        np.testing.assert_array_equal(s0.block_tables, [[2, 3], [4, 5]])
        np.testing.assert_array_equal(s1.token_ids, [-1, -2])  # rows 0 and 1 of step 0
        np.testing.assert_array_equal(s2.token_ids, [-2])      # only the 3-draft stream, row 1 of step 1
        np.testing.assert_array_equal(s2.positions, [22])
        p.write(np.array([51, 61, 52, 62, 63], np.int32), seen)
        np.testing.assert_array_equal(b.token_ids, [1, 2, 3, 4, 50, 51, 52, 60, 61, 62, 63])
        self.assertEqual(seen, {8: (11, 52), 9: (23, 63)})  # positions below prefix + d; the last draft, not run
        m = mirror_batch(b, np.array([True, False, True]))
        np.testing.assert_array_equal(m.token_ids, [1, 2, 3, 4, 60, 61, 62, 63])
        np.testing.assert_array_equal(m.prefix_lens, [0, 20])
        np.testing.assert_array_equal(m.query_starts, [0, 4, 8])

    def test_forced_acceptance_keeps_drafts_only(self):
        tokens = torch.tensor([5, 6, 7, 8], dtype=torch.int32)
        drafts = np.array([9, -1, 10, -1], np.int32)
        out = force_acceptance(tokens, drafts, 1.0, torch.Generator().manual_seed(0))
        self.assertEqual(out.tolist(), [9, 6, 10, 8])
        kept = force_acceptance(tokens.repeat(500), np.tile(drafts, 500), 0.3, torch.Generator().manual_seed(0))
        rate = (kept.view(500, 4)[:, 0] == 9).float().mean().item()
        self.assertAlmostEqual(rate, 0.3, delta=0.07)
        self.assertIs(force_acceptance(tokens, None, 1.0, torch.Generator()), tokens)
        on_device = torch.tensor([9, -1, 10, -1])  # (DeviceDrafts: draft_tokens only says which rows have one)
        out = force_acceptance(tokens, np.array([0, -1, 0, -1], np.int32), 1.0, torch.Generator(), on_device)
        self.assertEqual(out.tolist(), [9, 6, 10, 8])

    def test_drafts_left_on_the_device_fill_the_forward_the_rows_and_the_batch(self):
        # Two drafting streams: query tokens [known, d1, d2] and [known, d1], drafts in step order
        # (step 0's rows, then step 1's): what the core would have read from b.token_ids.
        from rtp_llm.async_decoder_engine.draft_model import DeviceDrafts, draft_token_indices, write_drafts

        b = SimpleNamespace(token_ids=np.array([7, 7, 7, 3, 3], np.int32))  # (the core's placeholders)
        first, d = np.array([0, 3]), np.array([2, 1])
        at = draft_token_indices(first, d)
        np.testing.assert_array_equal(at, [1, 4, 2])
        drafts = DeviceDrafts(b, at, torch.tensor([11, 21, 12]), lambda a: torch.from_numpy(np.ascontiguousarray(a)))
        forward = torch.from_numpy(b.token_ids.astype(np.int64))
        drafts.scatter(forward)
        self.assertEqual(forward.tolist(), [7, 11, 12, 3, 21])
        # sampler rows: stream 0's 3 rows verify d1, d2, then the bonus row; stream 1's 2 rows
        self.assertEqual(drafts.values_at(np.array([1, 2, -1, 4, -1])).tolist(), [11, 12, -1, 21, -1])
        self.assertEqual(drafts.values_at(np.array([[1, 0], [4, -1]])).tolist(), [[11, -1], [21, -1]])
        drafts.land(np.array([11, 21, 12, 99]))
        expect = np.array([7, 7, 7, 3, 3], np.int32)
        write_drafts(SimpleNamespace(token_ids=expect), first, d, np.array([11, 21, 12]))
        np.testing.assert_array_equal(b.token_ids, expect)
        np.testing.assert_array_equal(b.token_ids, [7, 11, 12, 3, 21])

    def test_rejection_sampling_takes_drafts_on_the_device_as_from_the_host(self):
        from rtp_llm.models_py.rejection_sampler import RowDraws, sample_rows

        g = torch.Generator().manual_seed(1)
        probs = torch.rand(6, 50, generator=g).pow(4)
        drafts = np.array([3, 17, -1, 40, 8, -1], np.int32)
        rows = SimpleNamespace(random_seed=np.arange(6) + 5, num_generated=np.arange(6))
        s = np.arange(6)

        def draws():
            return RowDraws(rows, s, torch.device("cpu"), lambda a: torch.from_numpy(np.ascontiguousarray(a)))
        host = sample_rows(probs, drafts, draws())
        placeholders = np.where(drafts >= 0, 0, -1).astype(np.int32)
        device = sample_rows(probs, placeholders, draws(), torch.from_numpy(drafts.astype(np.int64)))
        self.assertEqual(device.tolist(), host.tolist())


if __name__ == "__main__":
    unittest.main()
