"""Speculative decoding with DeepSeek-V3's multi-token-prediction layer (--sp_type=mtp,
models_py/mtp.py, driven by async_decoder_engine/eagle_drafter.py) on a tiny DeepSeek-V3 with a
random MTP layer written as V3 checkpoints store it (rtp_llm/test/mtp_ref.py): the greedy text is
the plain engine's, and every draft the engine proposes is the one HF's own decoder layer computes
over the HF model's final hidden states (so the layer's latent KV cache, its MoE and the drafter's
rows are right), whole and chunked, with drafts forced through; with the layer's own embedding
table and without; the layer's copies of the model's tables are the model's tensors, loaded once
(its own head, different, is its own); a checkpoint without the layer is refused by field."""

import functools
import os
import shutil
import tempfile
import unittest
from unittest import mock

from rtp_llm.async_decoder_engine.draft_model import FORCE_ACCEPT_ENV
from rtp_llm.config.speculative import SpeculativeConfig
from rtp_llm.llm import LLM
from rtp_llm.model_loader.weights import CheckpointError
from rtp_llm.test.eagle3_ref import draft_mismatches, generate_recording_drafts
from rtp_llm.test.mtp_ref import add_mtp_layer, reference_mtp_drafts
from rtp_llm.test.testlib import make_tiny, random_prompts

GREEDY = {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}


class MtpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        plain = make_tiny("deepseek_v3_noaux", cls.tmp.name)
        cls.target = add_mtp_layer(shutil.copytree(plain, os.path.join(cls.tmp.name, "own_embed")), seed=3)
        cls.shared = add_mtp_layer(shutil.copytree(plain, os.path.join(cls.tmp.name, "shared_embed")), seed=4,
                                   own_embed=False)
        # the layer's embedding table and head both copies of the model's, as V3 ships them
        cls.copies = add_mtp_layer(shutil.copytree(plain, os.path.join(cls.tmp.name, "copies")), seed=5,
                                   head_copy=True)
        cls.plain = plain

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_engine(self, target, prompts, mtp: bool, **engine_args):
        spec = SpeculativeConfig("mtp", 3) if mtp else SpeculativeConfig()
        llm = LLM(target, act_type="fp32", progress=False, max_seq_len=256, speculative=spec, **engine_args)
        try:
            return (*generate_recording_drafts(llm, prompts, GREEDY), llm.engine.core.stats())
        finally:
            llm.close()

    def check(self, target, prompts, **engine_args):
        outs, proposals, stats = self.run_engine(target, prompts, True, **engine_args)
        self.assertGreater(stats["spec_draft_tokens"], 0)
        self.assertEqual(stats["used_blocks"], 0)
        self.assertTrue(proposals)
        self.assertEqual(draft_mismatches(functools.partial(reference_mtp_drafts, target), prompts, outs, proposals), [])
        return outs, stats

    def test_greedy_text_is_the_plain_engines_and_drafts_are_the_layers(self):
        prompts = random_prompts(6, [4, 17, 30])
        plain, _, _ = self.run_engine(self.target, prompts, False)
        for target in (self.target, self.shared, self.copies):
            for engine_args in ({}, {"max_num_batched_tokens": 16}):
                with self.subTest(target=os.path.basename(target), **engine_args):
                    outs, _ = self.check(target, prompts, **engine_args)
                    for a, b in zip(plain, outs):
                        self.assertEqual(b.outputs[0].token_ids, a.outputs[0].token_ids)

    def test_the_layers_copies_of_the_models_tables_are_the_models_tensors(self):
        embed, head = "model.embed_tokens.weight", "lm_head.weight"
        for target, shared in ((self.target, (embed,)), (self.shared, (embed,)), (self.copies, (embed, head))):
            llm = LLM(target, act_type="fp32", progress=False, max_seq_len=256, speculative=SpeculativeConfig("mtp", 3))
            try:
                layer, model = llm.engine.runner.drafter.head, llm.engine.runner.model
                with self.subTest(target=os.path.basename(target)):
                    self.assertEqual(layer.shared, shared)
                    self.assertIs(layer.model.embed, model.embed)
                    self.assertEqual(layer.model.lm_head is model.lm_head, head in shared)
            finally:
                llm.close()

    def test_forced_acceptance_keeps_the_layers_cache_right(self):
        with mock.patch.dict(os.environ, {FORCE_ACCEPT_ENV: "0.6"}):
            _, stats = self.check(self.target, random_prompts(7, [9, 24]), max_num_batched_tokens=16)
        self.assertGreater(stats["spec_accepted_tokens"], 0)

    def test_a_checkpoint_without_the_layer_is_refused_by_field(self):
        with self.assertRaisesRegex(CheckpointError, "has no multi-token-prediction layer"):
            LLM(make_tiny("qwen3_gqa_untied", self.tmp.name), act_type="fp32", progress=False,
                speculative=SpeculativeConfig("mtp", 3))


if __name__ == "__main__":
    unittest.main()
