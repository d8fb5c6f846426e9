"""Speculative decoding with an EAGLE-3 head (--sp_type=eagle3, async_decoder_engine/eagle_drafter.py)
on a tiny 4-layer Qwen3 target and random heads written as published heads are
(rtp_llm/test/eagle3_ref.py): the greedy text is the plain engine's; every draft the engine
proposes is the one a plain-torch head computes from the HF target's hidden states over the
stream's tokens (so the head's mirrored KV cache, its carried chunk rows and its rows of verify
steps are right), with chunked prefill, overlap scheduling, a draft vocabulary smaller than the
target's, and drafts forced through at a chosen rate (the benchmark's mode, which exercises the
accepted and rejected rows of verify steps); a head for another model is refused by field."""

import functools
import os
import tempfile
import unittest
from unittest import mock

from rtp_llm.async_decoder_engine.draft_model import FORCE_ACCEPT_ENV
from rtp_llm.config.speculative import SpeculativeConfig
from rtp_llm.llm import LLM
from rtp_llm.model_loader.weights import CheckpointError
from rtp_llm.test.eagle3_ref import (EAGLE_TARGET, draft_mismatches, generate_recording_drafts, reference_drafts,
                                     write_eagle3_head)
from rtp_llm.test.testlib import make_tiny, random_prompts

NEW_TOKENS = 24
GREEDY = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}


class Eagle3Test(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.target = make_tiny("qwen3_4layers", cls.tmp.name, spec=EAGLE_TARGET)
        cls.head = write_eagle3_head(os.path.join(cls.tmp.name, "head"), cls.target, seed=1)
        cls.small = write_eagle3_head(os.path.join(cls.tmp.name, "small"), cls.target, seed=2, draft_vocab=100,
                                      aux_layers=(0, 1, 3))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_engine(self, prompts, head=None, config=GREEDY, **engine_args):
        """(outputs, the drafts proposed: eagle3_ref.generate_recording_drafts, engine stats)."""
        spec = SpeculativeConfig("eagle3", 3, sp_checkpoint_path=head) if head else SpeculativeConfig()
        llm = LLM(self.target, act_type="fp32", progress=False, max_seq_len=256, speculative=spec, **engine_args)
        try:
            return (*generate_recording_drafts(llm, prompts, config), llm.engine.core.stats())
        finally:
            llm.close()

    def assert_drafts_are_the_heads(self, prompts, outs, proposed, head):
        self.assertGreater(len(proposed), 0)
        reference = functools.partial(reference_drafts, self.target, head)
        self.assertEqual(draft_mismatches(reference, prompts, outs, proposed), [])

    def test_greedy_text_is_the_plain_engines_and_drafts_are_the_heads(self):
        prompts = random_prompts(3, [5, 19, 33])
        plain, _, _ = self.run_engine(prompts)
        for head in (self.head, self.small):
            for engine_args in ({}, {"max_num_batched_tokens": 16}, {"overlap_schedule": True}):
                with self.subTest(head=os.path.basename(head), **engine_args):
                    outs, proposed, stats = self.run_engine(prompts, head, **engine_args)
                    for a, b in zip(plain, outs):
                        self.assertEqual(b.outputs[0].token_ids, a.outputs[0].token_ids)
                    self.assertGreater(stats["spec_draft_tokens"], 0)
                    self.assert_drafts_are_the_heads(prompts, outs, proposed, head)

    def test_forced_acceptance_keeps_the_heads_cache_right(self):
        # Drafts forced through at 60%: verify steps keep 1..4 tokens; the head's rows of the kept
        # positions (and only those) must hold what the reference computes over the kept text.
        prompts = random_prompts(4, [7, 26])
        with mock.patch.dict(os.environ, {FORCE_ACCEPT_ENV: "0.6"}):
            outs, proposed, stats = self.run_engine(prompts, self.head, max_num_batched_tokens=16)
        self.assertGreater(stats["spec_accepted_tokens"], 0)
        self.assertLess(stats["spec_accepted_tokens"], stats["spec_draft_tokens"])
        self.assert_drafts_are_the_heads(prompts, outs, proposed, self.head)

    def test_penalized_and_seeded_rows_read_the_heads_drafts(self):
        # A penalized row's history holds the drafts before it (read on the host: the drafts are
        # copied before the step); a sampled row verifies its draft by rejection sampling on the
        # device. Greedy with a penalty is the plain engine's text; a seeded sample repeats.
        prompts = random_prompts(5, [9, 23])
        penalized = dict(GREEDY, repetition_penalty=1.3)
        plain, _, _ = self.run_engine(prompts, config=penalized)
        outs, proposed, stats = self.run_engine(prompts, self.head, config=penalized)
        self.assertEqual([o.outputs[0].token_ids for o in outs], [o.outputs[0].token_ids for o in plain])
        self.assertGreater(stats["spec_draft_tokens"], 0)
        seeded = dict(GREEDY, temperature=0.8, top_k=20, random_seed=7)
        runs = [self.run_engine(prompts, self.head, config=seeded, overlap_schedule=True) for _ in range(2)]
        self.assertGreater(runs[0][2]["spec_draft_tokens"], 0)
        self.assertEqual(*[[o.outputs[0].token_ids for o in outs] for outs, _, _ in runs])

    def test_a_head_for_another_model_is_refused_by_field(self):
        other = make_tiny("qwen3_gqa_untied", self.tmp.name)  # 2 layers: the default aux layers do not exist
        with self.assertRaisesRegex(CheckpointError, r"eagle_aux_hidden_state_layer_ids \[2, 1, -1\] must be 3 layers "
                                                     r"of the target's 2"):
            LLM(other, act_type="fp32", progress=False,
                speculative=SpeculativeConfig("eagle3", 3, sp_checkpoint_path=self.head))
        with self.assertRaisesRegex(CheckpointError, "is not an EAGLE-3 head"):
            LLM(self.target, act_type="fp32", progress=False,
                speculative=SpeculativeConfig("eagle3", 3, sp_checkpoint_path=self.target))


if __name__ == "__main__":
    unittest.main()
