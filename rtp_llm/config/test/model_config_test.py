"""ModelConfig as an HF checkpoint's config.json (and generation_config.json) parse into it:
the fields' sources and defaults, the families' traits, rope scaling, EOS ids, and bad
values rejected naming the field."""

import json
import os
import tempfile
import unittest

from rtp_llm.config.model_config import ModelConfig, RopeScaling
from rtp_llm.model_loader.hf_loader import read_hf_config

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 1000, "hidden_size": 256, "num_hidden_layers": 3,
         "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512,
         "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
         "tie_word_embeddings": True, "eos_token_id": 7, "bos_token_id": 3}


class ModelConfigTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def read(self, config, generation=None, model_type=None):
        with open(os.path.join(self.tmp.name, "config.json"), "w") as f:
            json.dump(config, f)
        gen = os.path.join(self.tmp.name, "generation_config.json")
        if generation is not None:
            with open(gen, "w") as f:
                json.dump(generation, f)
        elif os.path.exists(gen):
            os.remove(gen)
        return read_hf_config(self.tmp.name, model_type)

    def test_every_field_from_config_json(self):
        self.assertEqual(self.read(QWEN3), ModelConfig(
            model_type="qwen_3", vocab_size=1000, hidden_size=256, num_layers=3, num_heads=8, num_kv_heads=2,
            head_dim=64, intermediate_size=512, rms_norm_eps=1e-5, rope_theta=1000000.0,
            rope_scaling=RopeScaling(), max_position_embeddings=40960, tie_word_embeddings=True, qkv_bias=False,
            qk_norm=True, eos_token_ids=[7], bos_token_id=3))

    def test_defaults_of_what_config_json_leaves_out(self):
        cfg = {k: v for k, v in QWEN3.items() if k in ("architectures", "vocab_size", "hidden_size",
                                                       "num_hidden_layers", "num_attention_heads",
                                                       "intermediate_size")}
        c = self.read(cfg)
        self.assertEqual((c.num_kv_heads, c.head_dim), (8, 256 // 8))  # MHA; hidden_size / heads
        self.assertEqual((c.rms_norm_eps, c.rope_theta, c.max_position_embeddings, c.tie_word_embeddings),
                         (1e-6, 10000.0, 4096, False))
        self.assertEqual((c.eos_token_ids, c.bos_token_id), ([], None))
        self.assertEqual(c.rope_scaling, RopeScaling(kind="default", factor=1.0))
        self.assertEqual(ModelConfig("llama", 1, 2, 1, 1, 1, 2, 1), ModelConfig(
            "llama", 1, 2, 1, 1, 1, 2, 1, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=RopeScaling(),
            max_position_embeddings=4096, tie_word_embeddings=False, qkv_bias=False, qk_norm=False,
            eos_token_ids=[], bos_token_id=None))

    def test_family_traits_and_model_type_override(self):
        qwen2 = dict(QWEN3, architectures=["Qwen2ForCausalLM"])
        c = self.read(qwen2)
        self.assertEqual((c.model_type, c.qkv_bias, c.qk_norm), ("qwen_2", True, False))
        c = self.read(dict(QWEN3, architectures=["LlamaForCausalLM"], attention_bias=True))
        self.assertEqual((c.model_type, c.qkv_bias, c.qk_norm), ("llama", True, False))
        c = self.read(dict(QWEN3, architectures=["LlamaForCausalLM"]))
        self.assertEqual((c.qkv_bias, c.qk_norm), (False, False))
        self.assertEqual(self.read(qwen2, model_type="qwen_3").model_type, "qwen_3")  # --model_type wins

    def test_eos_ids_from_generation_config_first(self):
        self.assertEqual(self.read(QWEN3, {"eos_token_id": [5, 9], "bos_token_id": 4}).eos_token_ids, [5, 9])
        self.assertEqual(self.read(QWEN3, {"bos_token_id": 4}).eos_token_ids, [7])
        self.assertEqual(self.read(QWEN3, {"bos_token_id": 4}).bos_token_id, 4)

    def test_rope_scaling(self):
        c = self.read(dict(QWEN3, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0,
                                                "high_freq_factor": 5.0,
                                                "original_max_position_embeddings": 4096}))
        self.assertEqual(c.rope_scaling, RopeScaling(kind="llama3", factor=8.0, low_freq_factor=2.0,
                                                     high_freq_factor=5.0, original_max_position=4096))
        c = self.read(dict(QWEN3, rope_scaling={"type": "linear", "factor": 2.0}))
        self.assertEqual(c.rope_scaling, RopeScaling(kind="linear", factor=2.0))
        # transformers 5 keeps theta and scaling under rope_parameters
        c = self.read(dict({k: v for k, v in QWEN3.items() if k != "rope_theta"},
                           rope_parameters={"rope_type": "linear", "factor": 3.0, "rope_theta": 5e5}))
        self.assertEqual((c.rope_theta, c.rope_scaling), (5e5, RopeScaling(kind="linear", factor=3.0)))

    def test_bad_values_are_rejected_naming_the_field(self):
        cases = [(dict(QWEN3, num_key_value_heads=3), "num_key_value_heads"),
                 (dict(QWEN3, head_dim=63), "head_dim"),
                 (dict(QWEN3, rope_scaling={"rope_type": "yarn", "factor": 4.0}), "yarn"),
                 (dict(QWEN3, architectures=["MistralForCausalLM"]), "MistralForCausalLM")]
        for cfg, named in cases:
            with self.subTest(named), self.assertRaises(ValueError) as cm:
                self.read(cfg)
            self.assertIn(named, str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            ModelConfig("llama", 10, 8, 1, num_heads=4, num_kv_heads=3, head_dim=2, intermediate_size=8).validate()
        self.assertIn("num_attention_heads (4)", str(cm.exception))

    def test_no_config_json_is_named(self):
        with self.assertRaises(ValueError) as cm:
            read_hf_config(self.tmp.name)
        self.assertIn("config.json", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
