"""--load_format=dummy (model_loader/dummy.py): a directory holding only config.json (no
weights) loads with random weights of exactly the shapes the model expects, the same ones for
the same seed, and generates, for a dense, a MoE and a DeepSeek (MLA) architecture; a GGUF file
or an unknown format is refused by flag name."""

import os
import shutil
import tempfile
import unittest

import torch

from rtp_llm.test.testlib import make_tiny

MODELS = ("qwen3_gqa_untied", "qwen3_moe_dense_first", "deepseek_v2_grouped")


class DummyLoadTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.configs = {}
        for name in MODELS:
            full = make_tiny(name, os.path.join(cls.tmp.name, "full"))
            bare = os.path.join(cls.tmp.name, "bare", name)
            os.makedirs(bare)
            shutil.copy(os.path.join(full, "config.json"), bare)
            cls.configs[name] = bare

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_weights_have_the_expected_shapes_and_repeat_per_seed(self):
        from rtp_llm.model_loader import load_model
        from rtp_llm.model_loader.dummy import dummy_weights
        from rtp_llm.model_loader.weights import expected_weights

        path = self.configs["qwen3_gqa_untied"]
        a = load_model(path, dtype=torch.bfloat16, progress=False, load_format="dummy")
        b = load_model(path, dtype=torch.bfloat16, progress=False, load_format="dummy")
        self.assertEqual({n: tuple(t.shape) for n, t in a.weights.items()}, expected_weights(a.config))
        self.assertTrue(all(torch.equal(a.weights[n], b.weights[n]) for n in a.weights))
        self.assertTrue(all(t.dtype == torch.bfloat16 for t in a.weights.values()))
        q = a.weights["model.layers.0.self_attn.q_proj.weight"]
        self.assertLess(float(q.float().abs().max()), 0.036)
        self.assertGreater(float(q.float().std()), 0.015)
        self.assertTrue(bool((a.weights["model.norm.weight"] == 1).all()))
        other = dummy_weights(a.config, torch.bfloat16, progress=False, seed=1)
        self.assertFalse(torch.equal(other["model.layers.0.self_attn.q_proj.weight"], q))

    def test_each_architecture_generates_without_weight_files(self):
        from rtp_llm.llm import LLM

        for name, path in self.configs.items():
            llm = LLM(path, load_format="dummy", progress=False, max_seq_len=64, kv_cache_mem_mb=16)
            out = llm.generate([[1, 2, 3, 4]], {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True})
            self.assertEqual(len(out[0].outputs[0].token_ids), 6, name)
            llm.close()

    def test_what_it_cannot_make_is_refused_by_flag_name(self):
        from rtp_llm.model_loader import load_model

        with self.assertRaisesRegex(ValueError, "--load_format must be one of auto, dummy, got 'random'"):
            load_model(self.configs["qwen3_gqa_untied"], progress=False, load_format="random")
        gguf = os.path.join(self.tmp.name, "m.gguf")
        open(gguf, "wb").close()
        with self.assertRaisesRegex(ValueError, "--load_format=dummy makes weights from an HF config.json"):
            load_model(gguf, progress=False, load_format="dummy")


if __name__ == "__main__":
    unittest.main()
