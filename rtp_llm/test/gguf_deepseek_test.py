"""llama.cpp's deepseek2 GGUF files (DeepSeek-V2 / V3 as published in GGUF) on tiny random
checkpoints written the way llama.cpp's converter writes them (deepseek_gguf.py: the early-2025
form with attn_kv_b whole, and today's with attn_k_b / attn_v_b split): a V2 file (softmax greedy
routing, no q LoRA, two shared experts, YaRN) and a V3 file (sigmoid routing with the correction
bias, 3 expert groups of which 2 are kept, top-3 of 9 experts renormalized and scaled, q LoRA, a
dense first layer, YaRN) give HF transformers' greedy tokens exactly in fp32; both forms load
HF's own tensors; a Q8_0 file loads with the file's values (the latent projections and experts
widened, attn_output kept in its blocks); the tokenizer comes from the file's vocabulary (which
transformers' AutoTokenizer does not read for deepseek2); missing keys and what llama.cpp would
run otherwise are refused by name."""

import os
import unittest
from unittest import mock

import torch

from rtp_llm.test.deepseek_gguf import GGUF_MLA, make_fixture, write_deepseek_gguf
from rtp_llm.test.testlib import PARITY_BATCH, add_tiny_tokenizer, fp32_greedy, greedy_config, hf_greedy, hf_model

NEW_TOKENS = 32
BATCH = PARITY_BATCH[:3]
V2, V3 = "deepseek_v2_gguf", "deepseek_v3_gguf"


class DeepseekGgufTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import tempfile

        cls.tmp = tempfile.TemporaryDirectory()
        cls.paths = {name: make_fixture(name, cls.tmp.name) for name in GGUF_MLA}
        cls.tokenizer = add_tiny_tokenizer(os.path.join(cls.tmp.name, "tokenizer"))
        cls.ref = {}
        for name, path in cls.paths.items():
            hf = hf_model(path)
            cls.ref[name] = [hf_greedy(hf, p, NEW_TOKENS) for p in BATCH]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def gguf(self, name: str, tag: str, **kwargs) -> str:
        return write_deepseek_gguf(self.paths[name], os.path.join(self.tmp.name, f"{name}-{tag}.gguf"), **kwargs)

    def load(self, path: str, **kwargs):
        from rtp_llm.model_loader import load_model

        return load_model(path, tokenizer_path=self.tokenizer, tokenizer=False, progress=False, **kwargs)

    def test_f32_files_give_hf_tokens(self):
        # Written exactly (F32): V2 in both converter forms and as 2024's converter wrote it (no
        # gating or norm keys: llama.cpp's softmax fallback), V3 in today's form (the early-2025
        # converter wrote no expert-group keys, so llama.cpp, and we, route such a V3 file over
        # all experts, unlike transformers: test_both_forms_load_hf_tensors).
        config = greedy_config(NEW_TOKENS)
        v2_2024 = {"expert_gating_func": None, "expert_weights_norm": None}
        for name, form, edit in ((V2, "legacy", {}), (V2, "legacy", v2_2024), (V2, "split", {}), (V3, "split", {})):
            with self.subTest(name, form=form, edit=edit):
                path = self.gguf(name, f"{form}{len(edit)}", form=form, edit=edit)
                self.assertEqual(fp32_greedy(path, BATCH, config, tokenizer_path=self.tokenizer), self.ref[name])

    def test_both_forms_load_hf_tensors(self):
        from rtp_llm.model_loader.hf_loader import load_hf_weights, read_hf_config

        hf_config = read_hf_config(self.paths[V3])
        hf = load_hf_weights(self.paths[V3], hf_config, torch.float32, progress=False)
        for form in ("legacy", "split"):
            with self.subTest(form):
                loaded = self.load(self.gguf(V3, f"load-{form}", form=form))
                c = loaded.config
                self.assertEqual(sorted(loaded.weights), sorted(hf))
                for name, t in hf.items():  # kv_b_proj merged back from k_b / v_b exactly
                    self.assertTrue(torch.equal(loaded.weights[name], t), name)
                self.assertEqual((c.model_type, c.mla, c.num_heads), (hf_config.model_type, hf_config.mla, 4))
                m, h = c.moe, hf_config.moe
                self.assertEqual((m.routing, m.num_experts, m.top_k, m.intermediate_size, m.norm_topk_prob,
                                  m.shared_expert_intermediate_size, m.mlp_only_layers, m.routed_scaling_factor),
                                 (h.routing, h.num_experts, h.top_k, h.intermediate_size, h.norm_topk_prob,
                                  h.shared_expert_intermediate_size, h.mlp_only_layers, h.routed_scaling_factor))
                groups = (3, 2) if form == "split" else (1, 1)
                self.assertEqual((m.n_group, m.topk_group), groups)
                r = c.rope_scaling
                self.assertEqual((r.kind, r.factor, r.original_max_position, r.attention_factor),
                                 ("yarn", 4.0, 128, 1.0))
                self.assertAlmostEqual(r.mscale_all_dim, 1.0, places=6)
                self.assertAlmostEqual(c.mla.softmax_scale(r), hf_config.mla.softmax_scale(hf_config.rope_scaling),
                                       places=7)

    def test_q8_0_file_loads_the_files_values(self):
        import gguf
        import numpy as np

        from rtp_llm.model_loader.gguf_file import GGUFFile
        from rtp_llm.model_loader.quantized import QuantizedTensor
        from rtp_llm.model_loader.weights import DOWN, GATE_UP

        path = self.gguf(V3, "q8", form="split", qtype="Q8_0")
        file = {t.name: t for t in GGUFFile(path).tensors}
        self.assertEqual(file["blk.1.attn_k_b.weight"].tensor_type, gguf.GGMLQuantizationType.Q8_0)
        self.assertEqual(file["blk.1.ffn_gate_inp.weight"].tensor_type, gguf.GGMLQuantizationType.F32)
        w = self.load(path, dtype=torch.bfloat16).weights

        def values(name, dtype=torch.bfloat16):
            t = file[name]
            return torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)).to(dtype)

        p = "model.layers.1."
        k_b, v_b = values("blk.1.attn_k_b.weight"), values("blk.1.attn_v_b.weight")  # [4, 64, 32], [4, 48, 64]
        kv_b = torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(4 * 80, 64)
        self.assertTrue(torch.equal(w[p + "self_attn.kv_b_proj.weight"], kv_b))
        self.assertTrue(torch.equal(w[p + "self_attn.q_b_proj.weight"], values("blk.1.attn_q_b.weight")))
        gate, up = values("blk.1.ffn_gate_exps.weight"), values("blk.1.ffn_up_exps.weight")
        self.assertTrue(torch.equal(w[p + GATE_UP], torch.cat([gate, up], dim=1)))
        self.assertTrue(torch.equal(w[p + DOWN], values("blk.1.ffn_down_exps.weight")))
        self.assertTrue(torch.equal(w[p + "mlp.shared_experts.down_proj.weight"],
                                    values("blk.1.ffn_down_shexp.weight")))
        # the router and its bias stay fp32 (transformers routes in fp32 whatever the run dtype)
        self.assertTrue(torch.equal(w[p + "mlp.gate.weight"], values("blk.1.ffn_gate_inp.weight", torch.float32)))
        self.assertTrue(torch.equal(w[p + "mlp.gate.e_score_correction_bias"],
                                    values("blk.1.exp_probs_b.bias", torch.float32)))
        o = w[p + "self_attn.o_proj.weight"]  # kept as the file's blocks, for the CPU's kernels
        self.assertIsInstance(o, QuantizedTensor)
        self.assertTrue(torch.equal(o.dequantize(), values("blk.1.attn_output.weight")))

    def test_tokenizer_comes_from_the_files_vocabulary(self):
        # transformers' AutoTokenizer refuses deepseek2 (its GGUF config reader lacks it); the
        # loader builds the byte-level BPE from the file's tokens and merges instead.
        import json

        from transformers import AutoTokenizer

        with open(os.path.join(self.tokenizer, "tokenizer.json")) as f:
            model = json.load(f)["model"]
        tokens = sorted(model["vocab"], key=model["vocab"].get)
        path = self.gguf(V2, "vocab", vocab=(tokens, [" ".join(m) for m in model["merges"]]))
        from rtp_llm.model_loader import load_model

        text = '{"name": "Ada", "tags": ["x", "yy"]} 12345 bananas'
        want = AutoTokenizer.from_pretrained(self.tokenizer).encode(text)
        with mock.patch.dict(os.environ, XDG_CACHE_HOME=os.path.join(self.tmp.name, "cache")):
            for _ in ("converted", "read back from the cache"):
                loaded = load_model(path, progress=False)
                self.assertEqual(loaded.tokenizer.encode(text), want)
                self.assertEqual(loaded.config.eos_token_ids, [0])

    def test_missing_keys_and_other_semantics_are_refused_by_name(self):
        from rtp_llm.model_loader import CheckpointError

        cases = (
            (V3, "split", {"attention.kv_lora_rank": None}, r"deepseek2\.attention\.kv_lora_rank is missing"),
            (V3, "split", {"attention.q_lora_rank": None}, r"deepseek2\.attention\.q_lora_rank is missing"),
            (V2, "legacy", {"attention.key_length": None}, r"deepseek2\.attention\.key_length is missing"),
            (V2, "split", {"expert_shared_count": None}, r"deepseek2\.expert_shared_count is missing"),
            (V3, "split", {"expert_gating_func": None},
             r"softmax gating \(deepseek2\.expert_gating_func=absent\) with exp_probs_b"),
            (V3, "split", {"expert_gating_func": 3}, r"expert_gating_func=3 is not supported"),
            (V2, "split", {"expert_group_count": 7, "expert_group_used_count": 3}, r"expert_group_count=7"),
            (V2, "split", {"expert_weights_norm": True}, r"expert_weights_norm=True is not supported"),
            (V2, "split", {"rope.scaling.yarn_log_multiplier": None}, "yarn without deepseek2.rope.scaling"),
            (V2, "split", {"rope.scaling.type": "linear"}, r"rope\.scaling\.type='linear' is not supported"),
            (V2, "split", {"attention.layer_norm_rms_epsilon": 1e-5}, "layer_norm_rms_epsilon"),
            (V3, "split", {"nextn_predict_layers": 1}, r"nextn_predict_layers=1 is not supported"),
        )
        for i, (name, form, edit, message) in enumerate(cases):
            with self.subTest(message):
                with self.assertRaisesRegex(CheckpointError, message):
                    self.load(self.gguf(name, f"bad{i}", form=form, edit=edit))
        with self.assertRaisesRegex(CheckpointError, r"blk\.1\.attn_v_b\.weight is missing"):
            self.load(self.gguf(V3, "half", drop_tensors=("blk.1.attn_v_b.weight",)))

    def test_sigmoid_file_without_selection_bias_selects_by_plain_scores(self):
        # llama.cpp adds exp_probs_b only where the file has it: a zero bias is the same choice.
        w = self.load(self.gguf(V3, "nobias", drop_tensors=(".exp_probs_b.bias",))).weights
        for i in (1, 2):
            self.assertTrue(torch.equal(w[f"model.layers.{i}.mlp.gate.e_score_correction_bias"], torch.zeros(9)))


if __name__ == "__main__":
    unittest.main()
