"""--quantization=int8 (model_loader/quantize_at_load.py) on the CPU: the blocks it writes are
GGUF Q8_0 as the gguf package decodes them, within half a quantization step of the weights (and
CUDA's per-row int8 codes within half theirs); an
HF checkpoint's projections reach the backend packed as Q8_0 (no bf16 copy), the embedding and a
tied head stay bf16, and the next tokens follow the fp32 path; what we cannot run is refused by
flag name."""

import tempfile
import unittest

import numpy as np
import torch

from rtp_llm.test.fp32_agreement import teacher_forced
from rtp_llm.test.testlib import add_tiny_tokenizer, make_tiny, random_prompts

MODELS = ("qwen3_gqa_untied", "qwen2_mqa_tied")


class QuantizeAtLoadTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.paths = {name: add_tiny_tokenizer(make_tiny(name, cls.tmp.name)) for name in MODELS}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_blocks_are_q8_0_within_half_a_step(self):
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        from rtp_llm.model_loader.quantize_at_load import quantize_q8_0

        w = torch.randn(24, 96) * torch.logspace(-3, 1, 24).unsqueeze(1)
        w[3, 32:64] = 0  # an all-zero block: scale 0, weights 0
        q = quantize_q8_0(w.to(torch.bfloat16))
        self.assertEqual(q.blocks.shape, (24, 3 * 34))
        decoded = torch.from_numpy(np.array(dequantize(q.blocks.numpy(), GGMLQuantizationType.Q8_0))).reshape(24, 96)
        self.assertTrue(torch.equal(decoded.to(torch.bfloat16), q.dequantize()))  # (it widens to bf16)
        ref = w.to(torch.bfloat16).float()
        step = ref.reshape(24, 3, 32).abs().amax(-1, keepdim=True) / 127
        err = (decoded.float() - ref).reshape(24, 3, 32).abs()
        self.assertTrue(bool((err <= step * 0.5 * 1.01 + 1e-6).all()), float((err / step.clamp_min(1e-12)).max()))
        self.assertTrue(bool((decoded[3, 32:64] == 0).all()))

    def test_cuda_rows_are_int8_within_half_a_step(self):
        from rtp_llm.model_loader.int_weight import GroupIntTensor
        from rtp_llm.model_loader.quantize_at_load import quantize_int8_rows

        w = (torch.randn(24, 96) * torch.logspace(-3, 1, 24).unsqueeze(1)).to(torch.bfloat16)
        w[5] = 0  # an all-zero row: scale 1, weights 0
        t = quantize_int8_rows(w, torch.bfloat16)
        self.assertIsInstance(t, GroupIntTensor)
        self.assertEqual((t.bits, t.group, tuple(t.scale.shape), tuple(t.blocks.shape)), (8, 96, (24, 1), (24, 24)))
        self.assertTrue(bool((t.zero == 128).all()))
        got = GroupIntTensor(t.blocks, t.shape, torch.float32, t.scale, t.zero, t.group, t.bits).dequantize()
        step = w.float().abs().amax(1, keepdim=True) / 127
        err = (got - w.float()).abs()
        self.assertTrue(bool((err <= step * 0.5 * 1.001 + 1e-9).all()), float((err / step.clamp_min(1e-12)).max()))
        self.assertTrue(bool((got[5] == 0).all()))

    def test_projections_reach_the_backend_as_q8_0(self):
        from rtp_llm.device.cpu.q8_0 import Q8_0Linear
        from rtp_llm.llm import LLM

        for name, path in self.paths.items():
            llm = LLM(path, act_type="bf16", quantization="INT8", progress=False, max_seq_len=128, kv_cache_mem_mb=16)
            model = llm.engine.runner.model
            packed = [l.qkv for l in model.layers] + [l.o_proj for l in model.layers] + \
                     [l.gate_up for l in model.layers] + [l.down for l in model.layers]
            self.assertTrue(all(isinstance(p, Q8_0Linear) for p in packed), name)
            tied = llm.loaded.config.tie_word_embeddings
            self.assertEqual(isinstance(model.lm_head, Q8_0Linear), not tied, name)
            llm.close()

    def test_next_tokens_follow_the_fp32_path(self):
        # Teacher-forced as gguf_q8_0_test (a broken block or row order gives ~1/512).
        prompts = random_prompts(3, [5, 40, 130])
        for name, path in self.paths.items():
            reading = teacher_forced(path, prompts, 32, f"{name}: int8 bf16", path, 64, quantization="int8")
            self.assertGreaterEqual(reading.share, 0.85, name)

    def test_fp8_projections_are_e4m3_with_a_scale_per_row(self):
        from rtp_llm.model_loader import load_model
        from rtp_llm.model_loader.fp8_weight import Fp8Tensor
        from rtp_llm.model_loader.quantize_at_load import quantize_weights

        loaded = load_model(self.paths["qwen3_gqa_untied"], dtype=torch.bfloat16, progress=False)
        weights, config = dict(loaded.weights), loaded.config
        count = quantize_weights(weights, "fp8", config)  # on the CPU here; CUDA computes on the result
        projections = [n for n in weights if n.endswith("_proj.weight")]
        self.assertEqual(count, len(projections))
        for name in projections:
            t, w = weights[name], loaded.weights[name].float()
            self.assertIsInstance(t, Fp8Tensor)
            self.assertTrue(t.row_scaled and t.dtype == torch.bfloat16)
            torch.testing.assert_close(t.scale.flatten(), w.abs().amax(1) / 448)  # each row's max maps to 448
            # e4m3's 3 mantissa bits: within 1/16 of each weight, or half its smallest step near 0.
            err = (t.dequantize().float() - w).abs()
            self.assertTrue(torch.all(err <= w.abs() / 16 + t.scale * 2 ** -10), name)
        for name in ("model.embed_tokens.weight", "model.norm.weight"):
            self.assertIs(weights[name], loaded.weights[name])

    def test_what_cannot_run_is_refused_by_flag_name(self):
        from rtp_llm.config.server_config import parse_server_config
        from rtp_llm.llm import LLM

        path = self.paths["qwen3_gqa_untied"]
        for kwargs, words in [(dict(quantization="fp8", act_type="bf16"), "--quantization=fp8 runs on --device=cuda"),
                              (dict(quantization="w4a8", act_type="bf16"), "--quantization=w4a8 is not supported"),
                              (dict(quantization="int8", act_type="bf16", device="npu"), "--device=cpu/cuda"),
                              (dict(quantization="int8", act_type="fp32"), "--act_type=bf16")]:
            with self.assertRaises(ValueError) as e:
                LLM(path, progress=False, **kwargs)
            self.assertIn(words, str(e.exception))
        config = parse_server_config(["--checkpoint_path", path, "--int8_mode", "1"])
        config.validate()
        self.assertEqual(config.quantization, "int8")
        with self.assertRaises(ValueError) as e:
            parse_server_config(["--checkpoint_path", path, "--quantization", "w4a8"]).validate()
        self.assertIn("--quantization=w4a8", str(e.exception))


if __name__ == "__main__":
    unittest.main()
