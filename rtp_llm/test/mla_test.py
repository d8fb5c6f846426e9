"""DeepSeek-V2/V3 (deepseek2, deepseek3) on tiny random checkpoints (TINY_MLA: latent attention
with and without q LoRA, interleaved and plain rope, YaRN with an attention factor and the
mscale softmax scale, odd expert counts, top-k > 1, a dense first layer, greedy,
group-limited and noaux_tc routing, shared experts): greedy tokens equal HF transformers'
exactly in fp32 for a mixed-length batch, with chunked prefill, a prefix-cache hit, preemption
and overlapped steps, and at TP=2; prefill logits within 1e-4; the KV cache holds layers x
(kv_lora_rank + qk_rope_head_dim) elements per token; sharded and block-FP8 checkpoints load;
fields transformers and DeepSeek's code read differently and devices without MLA kernels are
refused by name. (llama.cpp's deepseek2 GGUF files: gguf_deepseek_test.py.)"""

import json
import os
import unittest

import torch

from rtp_llm.llm import LLM
from rtp_llm.test.testlib import TINY_MLA, hf_greedy, hf_model
from rtp_llm.test.testlib import (PARITY_BATCH, TinyHfFixtures, assert_prefix_cache_and_preemption_match_hf,
                                  fp32_greedy, greedy_config)

NEW_TOKENS = 32
CONFIG = greedy_config(NEW_TOKENS)
BATCH = PARITY_BATCH


def generate(path, batch, **engine_args):
    return fp32_greedy(path, batch, CONFIG, **engine_args)


class MlaParityTest(TinyHfFixtures, unittest.TestCase):
    FIXTURES, NEW_TOKENS = TINY_MLA, NEW_TOKENS

    def write_config(self, name: str, tag: str, **changes) -> str:
        """A copy of fixture `name`'s config.json (no weights) with these keys changed."""
        path = os.path.join(self.tmp.name, f"{name}-{tag}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(self.paths[name], "config.json")) as f:
            cfg = json.load(f)
        cfg.update(changes)
        cfg = {k: v for k, v in cfg.items() if v is not None}
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(cfg, f)
        return path

    def test_prefix_cache_preemption_and_overlap(self):
        # The chunk after the shared prefix reads the cached latents; 5 streams growing to ~70 tokens in 16 blocks.
        name = "deepseek_v3_noaux"
        assert_prefix_cache_and_preemption_match_hf(self, self.paths[name], self.hf[name], CONFIG, 16)

    def test_latent_cache_bytes_per_token(self):
        # MLA's promise: per token and layer kv_lora_rank + qk_rope_head_dim elements (here 32 + 8),
        # not 2 x heads x head dims (K 4 x 24 and V 4 x 20: 176).
        name = "deepseek_v2_grouped"
        layers, width = 3, 32 + 8
        for act, size in (("fp32", 4), ("bf16", 2)):
            with self.subTest(act):
                llm = LLM(self.paths[name], act_type=act, progress=False, max_seq_len=256, kv_cache_mem_mb=1,
                          warm_up=False)
                try:
                    kv, block = llm.engine.runner.kv_cache, llm.engine.runner.block_size
                    self.assertEqual(tuple(kv.shape), (layers, llm.engine.num_blocks, block, width))
                    per_token = kv.numel() * kv.element_size() // (llm.engine.num_blocks * block)
                    self.assertEqual(per_token, layers * width * size)
                    # the pool is sized by the same layout: the whole 1 MiB budget in blocks
                    self.assertEqual(llm.engine.num_blocks, (1 << 20) // (per_token * block))
                finally:
                    llm.close()

    def test_tp2_equals_hf(self):
        # Heads split over two ranks (q_b / q_proj, kv_b, o_proj), the latent cache replicated;
        # each expert's intermediate dimension and the shared and dense MLPs split.
        for name, args in (("deepseek_v3_noaux", {"max_num_batched_tokens": 16}), ("deepseek_v2_grouped", {})):
            with self.subTest(name):
                self.assertEqual(generate(self.paths[name], BATCH[:3], tp_size=2, **args), self.ref[name][:3])

    def test_sharded_checkpoint_packs_experts_as_hf(self):
        from rtp_llm.model_loader import load_model

        name = "deepseek_v2_greedy_qlora"
        sharded = os.path.join(self.tmp.name, "sharded")
        self.hf[name].save_pretrained(sharded, max_shard_size="100KB")
        self.assertTrue(os.path.exists(os.path.join(sharded, "model.safetensors.index.json")))
        loaded = load_model(sharded, progress=False)
        m = loaded.config.moe
        self.assertEqual((m.num_experts, m.top_k, m.intermediate_size, m.shared_expert_intermediate_size, m.routing),
                         (5, 2, 48, 48, "greedy"))
        self.assertEqual([loaded.config.is_sparse(i) for i in range(3)], [False, True, True])
        for i in (1, 2):
            experts = self.hf[name].model.layers[i].mlp.experts
            torch.testing.assert_close(loaded.weights[f"model.layers.{i}.mlp.experts.gate_up_proj"],
                                       experts.gate_up_proj.data, atol=0, rtol=0)
            torch.testing.assert_close(loaded.weights[f"model.layers.{i}.mlp.experts.down_proj"],
                                       experts.down_proj.data, atol=0, rtol=0)

    def test_block_fp8_checkpoint_loads_dequantized(self):
        # DeepSeek-V3's published format: e4m3 projections with [ceil(N / bn), ceil(K / bk)]
        # weight_scale_inv (partial blocks here), routers and norms plain.
        from rtp_llm.model_loader import load_model
        from rtp_llm.test.quant_writers import write_quantized

        name = "deepseek_v3_noaux"
        qdir, rdir, dequantized = write_quantized(self.paths[name], self.tmp.name, "fp8_block", name="v3-fp8",
                                                  shards=2, block=(32, 64))
        self.assertIn("model.layers.1.self_attn.kv_b_proj.weight", dequantized)
        ours, plain = load_model(qdir, progress=False).weights, load_model(rdir, progress=False).weights
        self.assertEqual(sorted(ours), sorted(plain))
        self.assertTrue(all(torch.equal(ours[k], plain[k]) for k in plain))
        hf = hf_model(rdir)
        self.assertEqual(generate(qdir, BATCH[:2]), [hf_greedy(hf, p, NEW_TOKENS) for p in BATCH[:2]])

    def test_fields_read_differently_are_refused_by_name(self):
        from rtp_llm.model_loader import CheckpointError
        from rtp_llm.model_loader.hf_loader import read_hf_config

        v2, v3 = "deepseek_v2_grouped", "deepseek_v3_noaux"
        for name, changes, message in (
                (v2, dict(norm_topk_prob=True), "norm_topk_prob=True is not supported"),
                (v2, dict(moe_layer_freq=2), "moe_layer_freq=2 is not supported"),
                (v2, dict(topk_method="noaux_tc"), "topk_method='noaux_tc' is not supported for deepseek2"),
                (v3, dict(scoring_func="softmax"), "scoring_func='softmax' is not supported"),
                (v3, dict(kv_lora_rank=None), "kv_lora_rank is missing"),
                (v3, dict(attention_bias=True), "attention_bias=True is not supported"),
                (v3, dict(rope_scaling={"type": "dynamic", "factor": 2.0}, rope_parameters=None),
                 "rope scaling type 'dynamic'")):
            with self.subTest(name, **changes):
                with self.assertRaisesRegex(CheckpointError, message):
                    read_hf_config(self.write_config(name, "bad", **changes))
        with self.assertRaisesRegex(ValueError, r"n_group \(4\) must divide n_routed_experts \(9\)"):
            read_hf_config(self.write_config(v3, "groups", n_group=4))

    def test_devices_without_mla_kernels_and_v32_are_refused_by_name(self):
        from rtp_llm.device import backend_class
        from rtp_llm.model_loader import UnsupportedModelError
        from rtp_llm.model_loader.hf_loader import read_hf_config
        from rtp_llm.models_py.decoder import DecoderModel

        config = read_hf_config(self.paths["deepseek_v3_noaux"])
        backend = object.__new__(backend_class("npu"))  # (never built: the refusal comes first)
        with self.assertRaisesRegex(ValueError, "MLA kernels for NPU are not built yet"):
            DecoderModel(config, {}, backend, 16)
        with self.assertRaisesRegex(UnsupportedModelError, "DeepseekV32ForCausalLM.*DeepSeek-V3.2.*not supported yet"):
            read_hf_config(self.write_config("deepseek_v3_noaux", "v32", architectures=["DeepseekV32ForCausalLM"]))


if __name__ == "__main__":
    unittest.main()
