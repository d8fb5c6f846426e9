"""The per-step token budget's default (DeviceBackend.default_step_tokens, EngineArgs.step_tokens):
a device that bounds a step's prompt work gives a big model fewer prompt tokens a step, never
fewer than MIN_STEP_TOKENS nor more than its default; a given --max_num_batched_tokens always
wins; tensor parallelism divides the work per rank. And weights.active_elements, which prices a
token: the embedding is not counted, a tied LM head is, routed experts count top_k of E."""

import json
import os
import tempfile
import unittest

from rtp_llm.async_decoder_engine.engine import EngineArgs
from rtp_llm.device.base import MIN_STEP_TOKENS, DeviceBackend
from rtp_llm.device.cpu.backend import CpuBackend
from rtp_llm.model_loader.hf_loader import read_hf_config
from rtp_llm.model_loader.weights import active_elements
from rtp_llm.tools.random_checkpoint import ARCHS

QWEN3 = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", max_position_embeddings=40960, rope_theta=1e6,
             rms_norm_eps=1e-6, torch_dtype="bfloat16", eos_token_id=1)


class Accelerator(DeviceBackend):
    """A device's class-level budget choices only (what default_step_tokens reads)."""

    default_max_num_batched_tokens = 8192
    prefill_step_flops = 3.2e13


def config(tmp: str, **fields):
    path = tempfile.mkdtemp(dir=tmp)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**QWEN3, **fields}, f)
    return read_hf_config(path)


class StepBudgetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.small = config(cls.tmp.name, **ARCHS["qwen3-0.6b"])
        cls.big = config(cls.tmp.name, **ARCHS["qwen3-8b"])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_a_big_model_gets_fewer_prompt_tokens_a_step(self):
        args = EngineArgs()
        self.assertEqual(args.step_tokens(Accelerator, self.small), 8192)  # capped at the device's default
        self.assertEqual(args.step_tokens(Accelerator, self.big), 2048)    # 2 x 6.9e9 FLOPs a token
        self.assertEqual(args.step_tokens(Accelerator, self.big, tp_size=2), 4096)  # half the work per rank
        self.assertEqual(args.step_tokens(Accelerator), 8192)              # model unknown: the default

    def test_the_budget_is_a_power_of_two_within_the_bounds(self):
        for flops in (1.0, 1e6, 2.9e9, 3.3e9, 1e10, 1e12, 1e15):
            n = Accelerator.default_step_tokens(flops)
            self.assertEqual(n & (n - 1), 0, flops)
            self.assertTrue(MIN_STEP_TOKENS <= n <= 8192, (flops, n))
            self.assertTrue(n == MIN_STEP_TOKENS or n * flops <= Accelerator.prefill_step_flops, (flops, n))

    def test_a_given_budget_and_an_unbounded_device_keep_theirs(self):
        self.assertEqual(EngineArgs(max_num_batched_tokens=8192).step_tokens(Accelerator, self.big), 8192)
        self.assertEqual(EngineArgs(max_num_batched_tokens=100).step_tokens(Accelerator, self.small), 100)
        self.assertIsNone(CpuBackend.prefill_step_flops)
        self.assertEqual(EngineArgs().step_tokens(CpuBackend, self.small), CpuBackend.default_max_num_batched_tokens)

    def test_active_elements_prices_what_a_token_computes_with(self):
        c = self.small  # tied: the LM head is the embedding, read again
        head = c.vocab_size * c.hidden_size
        self.assertEqual(active_elements(c) - active_elements(c, lm_head=False), head)
        layer = (2 * c.num_heads * c.head_dim * c.hidden_size + 2 * c.num_kv_heads * c.head_dim * c.hidden_size
                 + 3 * c.intermediate_size * c.hidden_size + 2 * c.hidden_size + 2 * c.head_dim)
        self.assertEqual(active_elements(c, lm_head=False), c.num_layers * layer + c.hidden_size)
        moe = config(self.tmp.name, **{**ARCHS["tiny"], "architectures": ["Qwen3MoeForCausalLM"],
                                      "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
                                      "moe_intermediate_size": 64, "decoder_sparse_step": 1,
                                      "norm_topk_prob": True})
        dense = config(self.tmp.name, **{**ARCHS["tiny"], "intermediate_size": 2 * 64})
        # Two of eight experts of width 64 compute as one dense MLP of width 128, plus the router.
        routers = moe.num_layers * moe.moe.num_experts * moe.hidden_size
        self.assertEqual(active_elements(moe), active_elements(dense) + routers)


if __name__ == "__main__":
    unittest.main()
