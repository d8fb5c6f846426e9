"""Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE) on tiny random checkpoints (TINY_MOE: odd
expert counts, top-k 2 and 3, a dense first layer, dense layers between sparse ones,
norm_topk_prob on and off, a shared expert): greedy tokens equal HF transformers' exactly in
fp32 for a mixed-length batch, also with chunked prefill, a prefix-cache hit, preemption and
overlapped steps; prefill logits within 1e-4; TP=2
gives TP=1's tokens; a sharded checkpoint's experts load packed into HF's own stacks; GGUF files
of both (llama.cpp's qwen3moe / qwen2moe) give HF's tokens, their quantized experts widened to the
file's values; DeepSeek-V3.2 is refused by name."""

import json
import os
import unittest

import torch

from rtp_llm.test.testlib import TINY_MOE
from rtp_llm.test.testlib import (PARITY_BATCH, TinyHfFixtures, assert_prefix_cache_and_preemption_match_hf,
                                  add_tiny_tokenizer, fp32_greedy, greedy_config, write_gguf)

NEW_TOKENS = 48
CONFIG = greedy_config(NEW_TOKENS)
BATCH = PARITY_BATCH


def generate(path, batch, **engine_args):
    return fp32_greedy(path, batch, CONFIG, **engine_args)


class MoeParityTest(TinyHfFixtures, unittest.TestCase):
    FIXTURES, NEW_TOKENS = TINY_MOE, NEW_TOKENS

    def test_prefix_cache_preemption_and_overlap(self):
        # Preemption: 5 streams growing to ~80 tokens (27 blocks of 16) in 20.
        name = "qwen2_moe_shared"
        assert_prefix_cache_and_preemption_match_hf(self, self.paths[name], self.hf[name], CONFIG, 20)

    def test_tp2_equals_tp1(self):
        # Each expert's intermediate dimension (and the shared expert's, and the dense layers')
        # split over two ranks; the router replicated.
        for name, args in (("qwen3_moe_dense_first", {}), ("qwen2_moe_shared", {"max_num_batched_tokens": 16})):
            with self.subTest(name):
                self.assertEqual(generate(self.paths[name], BATCH[:3], tp_size=2, **args), self.ref[name][:3])

    def test_sharded_checkpoint_packs_experts_as_hf(self):
        from rtp_llm.model_loader import load_model

        name = "qwen2_moe_shared"
        sharded = os.path.join(self.tmp.name, "sharded")
        self.hf[name].save_pretrained(sharded, max_shard_size="200KB")
        self.assertTrue(os.path.exists(os.path.join(sharded, "model.safetensors.index.json")))
        loaded = load_model(sharded, progress=False)
        m = loaded.config.moe
        self.assertEqual((m.num_experts, m.top_k, m.intermediate_size, m.shared_expert_intermediate_size),
                         (5, 2, 64, 128))
        self.assertEqual([loaded.config.is_sparse(i) for i in range(4)], [False, True, False, True])
        for i in (1, 3):  # transformers' own in-memory stacks: [E, 2 I, hidden] and [E, hidden, I]
            experts = self.hf[name].model.layers[i].mlp.experts
            torch.testing.assert_close(loaded.weights[f"model.layers.{i}.mlp.experts.gate_up_proj"],
                                       experts.gate_up_proj.data, atol=0, rtol=0)
            torch.testing.assert_close(loaded.weights[f"model.layers.{i}.mlp.experts.down_proj"],
                                       experts.down_proj.data, atol=0, rtol=0)
        self.assertNotIn("model.layers.1.mlp.experts.0.gate_proj.weight", loaded.weights)

    def test_deepseek_v32_is_refused_by_name(self):
        # (DeepSeek-V2/V3 are built: mla_test.py)
        from rtp_llm.model_loader import CheckpointError, UnsupportedModelError, load_model

        path = os.path.join(self.tmp.name, "DeepseekV32ForCausalLM")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32"}, f)
        with self.assertRaisesRegex(UnsupportedModelError, "DeepseekV32ForCausalLM.*DeepSeek-V3.2.*not supported yet"):
            load_model(path, progress=False)
        # a Qwen3-MoE checkpoint read as deepseek3 lacks the latent attention's fields, by name
        with self.assertRaisesRegex(CheckpointError, "kv_lora_rank is missing"):
            load_model(self.paths["qwen3_moe_raw_topk"], model_type="deepseek3", progress=False)

    def test_gguf_files_give_hf_tokens(self):
        # llama.cpp's qwen3moe / qwen2moe files (testlib.write_gguf: the converter's expert keys,
        # [E, rows, cols] expert stacks, the router, the gated shared expert, dense layers), written
        # exactly (F32), give HF's greedy tokens in fp32. (The files' token lists are placeholders:
        # a tokenizer of the fixtures' vocabulary comes from beside them.)
        for name in ("qwen3_moe_dense_first", "qwen2_moe_shared"):
            with self.subTest(name):
                path = write_gguf(self.paths[name], os.path.join(self.tmp.name, f"{name}.gguf"), qtype="F32")
                self.assertEqual(generate(path, BATCH[:3], tokenizer_path=self.tokenizer()), self.ref[name][:3])

    def tokenizer(self) -> str:
        path = os.path.join(self.tmp.name, "tokenizer")
        return path if os.path.isdir(path) else add_tiny_tokenizer(path)

    def test_quantized_gguf_experts_load_widened_to_the_files_values(self):
        import gguf
        import numpy as np

        from rtp_llm.model_loader import load_model
        from rtp_llm.model_loader.gguf_file import GGUFFile
        from rtp_llm.model_loader.weights import DOWN, GATE_UP

        name = "qwen2_moe_shared"
        path = write_gguf(self.paths[name], os.path.join(self.tmp.name, "q8.gguf"), qtype="Q8_0")
        loaded = load_model(path, dtype=torch.bfloat16, tokenizer_path=self.tokenizer(), progress=False)
        m = loaded.config.moe
        self.assertEqual((m.num_experts, m.top_k, m.intermediate_size, m.shared_expert_intermediate_size,
                          m.norm_topk_prob), (5, 2, 64, 128, False))
        self.assertEqual([loaded.config.is_sparse(i) for i in range(4)], [False, True, False, True])
        file = {t.name: t for t in GGUFFile(path).tensors}

        def values(t):
            data = gguf.quants.dequantize(t.data, t.tensor_type)
            return torch.from_numpy(np.array(data, dtype=np.float32)).to(torch.bfloat16)

        gate, up = values(file["blk.1.ffn_gate_exps.weight"]), values(file["blk.1.ffn_up_exps.weight"])
        stacks = loaded.weights
        self.assertTrue(torch.equal(stacks[f"model.layers.1.{GATE_UP}"], torch.cat([gate, up], dim=1)))
        self.assertTrue(torch.equal(stacks[f"model.layers.1.{DOWN}"], values(file["blk.1.ffn_down_exps.weight"])))
        self.assertEqual(tuple(stacks["model.layers.3.mlp.shared_expert_gate.weight"].shape), (1, 128))

    def test_gguf_moe_files_missing_expert_keys_are_refused_by_name(self):
        import gguf

        from rtp_llm.model_loader import CheckpointError, load_model

        path = os.path.join(self.tmp.name, "moe.gguf")
        writer = gguf.GGUFWriter(path, "qwen3moe")
        writer.add_block_count(1)
        writer.add_head_count(1)
        writer.add_embedding_length(8)
        writer.add_token_list(["a", "b"])
        writer.add_tensor("token_embd.weight", torch.zeros(2, 8).numpy())
        writer.add_tensor("blk.0.ffn_gate_exps.weight", torch.zeros(2, 4, 8).numpy())
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with self.assertRaisesRegex(CheckpointError, "qwen3moe.expert_count is missing"):
            load_model(path, progress=False)

if __name__ == "__main__":
    unittest.main()
