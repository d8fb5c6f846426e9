"""Quantized HF checkpoints (quantization_config) on tiny random models written in each format by
test/quant_writers.py: block FP8 (partial edge blocks, DeepSeek-V3 / Qwen3-FP8), per-tensor FP8
with static activation scales, compressed-tensors per-channel FP8, FBGEMM FP8, GPTQ (sym, asym,
desc_act's shuffled g_idx, v1 and v2 zero points, 4 and 8 bits, tensors straddling shards), AWQ
GEMM and a block-FP8 Qwen3-MoE. The loader's weights equal the writer's exactly dequantized ones
bit for bit (fp32, and rounded once to bf16), and our fp32 greedy tokens equal HF transformers'
on the dequantized weights saved as a plain checkpoint. Configurations this loader cannot read
exactly are refused at start-up, naming the quantization_config key."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch

from rtp_llm.llm import LLM
from rtp_llm.model_loader import CheckpointError, load_model
from rtp_llm.model_loader.fp8_weight import Fp8Tensor
from rtp_llm.model_loader.hf_loader import read_hf_config
from rtp_llm.model_loader.int_weight import GroupIntTensor
from rtp_llm.model_loader.quantized import cat_rows, take
from rtp_llm.test.quant_writers import SKIPPED, fp8_block, fp8_channel, gptq, rewrite_config, write_quantized
from rtp_llm.test.testlib import add_tiny_tokenizer, free_port, hf_greedy, hf_model, make_tiny, random_prompts

# case -> (tiny model, writer case, writer options)
CASES = {
    "fp8_block_48x80": ("qwen3_gqa_untied", "fp8_block", dict(block=(48, 80))),  # partial blocks in N and K
    "fp8_tensor_static": ("llama_gqa_tied", "fp8_tensor", {}),
    "ct_fp8_channel": ("qwen3_gqa_untied", "ct_fp8_channel", {}),
    "fbgemm_fp8": ("qwen2_mqa_tied", "fbgemm_fp8", {}),
    "gptq_sym": ("qwen3_gqa_untied", "gptq", dict(group_size=32)),
    "gptq_sym_desc_act_sharded": ("qwen2_mqa_tied", "gptq", dict(group_size=32, desc_act=True, shards=2)),
    "gptq_asym_g48": ("llama_gqa_tied", "gptq", dict(sym=False, group_size=48)),  # a partial last group
    "gptq_v2_asym_whole_k": ("qwen3_gqa_untied", "gptq", dict(sym=False, v2=True, group_size=-1)),
    "gptq_8bit": ("llama_mha_untied", "gptq", dict(bits=8, group_size=64)),
    "awq_gemm": ("qwen3_gqa_untied", "awq", dict(group_size=32)),
    # moe_intermediate_size 64 < 128: the experts' gate/up rows and down columns are partial blocks.
    "fp8_block_moe": ("qwen3_moe_dense_first", "fp8_block", dict(block=(128, 128))),
}
NEW_TOKENS = 24
PROMPTS = random_prompts(23, [4, 19, 37])


PACKED = (Fp8Tensor, GroupIntTensor)  # what the loader keeps as stored, for a backend with kernels for it


def widened(w):
    return w.dequantize() if isinstance(w, PACKED) else w


class QuantHfTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        root = cls.tmp.name
        srcs = {m: make_tiny(m, os.path.join(root, "src")) for m in {m for m, _, _ in CASES.values()}}
        cls.src = srcs
        cls.cases = {name: write_quantized(srcs[model], root, case, name=name, **opts)
                     for name, (model, case, opts) in CASES.items()}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_loaded_weights_are_the_exact_dequantized_weights(self):
        for name, (qdir, rdir, dequantized) in self.cases.items():
            with self.subTest(name):
                loaded = load_model(qdir, progress=False).weights
                # Projections stay as stored until packed (MoE experts are stacked widened)
                kept = sorted(k for k, w in loaded.items() if isinstance(w, PACKED))
                self.assertTrue(kept and all(k.endswith("_proj.weight") and ".experts." not in k for k in kept))
                want_type = GroupIntTensor if CASES[name][1] in ("gptq", "awq") else Fp8Tensor
                self.assertTrue(all(isinstance(loaded[k], want_type) for k in kept))
                ours = {k: widened(w) for k, w in loaded.items()}  # as a backend without kernels widens them
                plain = load_model(rdir, progress=False).weights
                self.assertEqual(sorted(ours), sorted(plain))
                for key in plain:  # every tensor, the skipped projection and MoE's packed experts included
                    self.assertTrue(torch.equal(ours[key], plain[key]), f"{name}: {key}")
                src = load_model(self.src[CASES[name][0]], progress=False).weights
                self.assertTrue(torch.equal(ours[SKIPPED + ".weight"], src[SKIPPED + ".weight"]))
                for key, want in dequantized.items():
                    if key in ours:  # (MoE experts are packed: compared through `plain` above)
                        self.assertTrue(torch.equal(ours[key], want), f"{name}: {key}")
                        self.assertFalse(torch.equal(want, src[key]), f"{name}: {key} was not quantized")
        for name in ("fp8_block_48x80", "gptq_asym_g48", "awq_gemm"):  # one rounding from the fp32 product
            with self.subTest(name, dtype="bf16"):
                qdir, rdir, _ = self.cases[name]
                loaded = load_model(qdir, dtype=torch.bfloat16, progress=False).weights
                ours = {k: widened(w) for k, w in loaded.items()}
                plain = load_model(rdir, dtype=torch.bfloat16, progress=False).weights
                self.assertTrue(all(torch.equal(ours[k], plain[k]) for k in plain), name)

    def test_greedy_tokens_equal_hf_on_the_dequantized_weights(self):
        config = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
        for name, (qdir, rdir, _) in self.cases.items():
            with self.subTest(name):
                hf = hf_model(rdir)
                want = [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
                llm = LLM(qdir, act_type="fp32", progress=False, max_seq_len=128)
                try:
                    self.assertEqual([o.outputs[0].token_ids for o in llm.generate(PROMPTS, config)], want)
                finally:
                    llm.close()

    def test_fp8_weights_slice_and_stack_as_their_values_do(self):
        torch.manual_seed(0)

        def fp8(n, k, block):
            w = (torch.randn(n, k) * 100).to(torch.float8_e4m3fn)
            if block is None:
                return Fp8Tensor.per_row(w, torch.rand(n) + 0.5, torch.float32)
            s = torch.rand(-(-n // block[0]), -(-k // block[1])) + 0.5
            return Fp8Tensor(w, (n, k), torch.float32, s, block)

        for block in (None, (32, 48)):
            a, b = fp8(96, 100, block), fp8(70, 100, block)  # b ends in a partial block of rows
            whole_a = a.dequantize()
            for rows, cols in (((32, 64), None), (None, (48, 52)), ((64, 32), (0, 48)), ((5, 30), None),
                               (None, (10, 20))):
                with self.subTest(block=block, rows=rows, cols=cols):
                    want = whole_a[rows[0]:sum(rows)] if rows else whole_a
                    want = want[:, cols[0]:sum(cols)] if cols else want
                    got = take(a, rows, cols)
                    # Whole blocks stay FP8; a cut through a block's scales is widened, never mis-split.
                    aligned = block is None or ((rows is None or rows[0] % 32 == 0) and
                                                (cols is None or cols[0] % 48 == 0))
                    self.assertEqual(isinstance(got, Fp8Tensor), aligned)
                    self.assertTrue(torch.equal(widened(got), want))
            with self.subTest(block=block, stack=True):
                joined = cat_rows([a, b])
                self.assertIsInstance(joined, Fp8Tensor)
                self.assertTrue(torch.equal(joined.dequantize(), torch.cat([whole_a, b.dequantize()])))
                # b's partial last block is not the end: the grid's rows are refined (70 = 2 x 35: bn' 2).
                refined = cat_rows([b, a])
                self.assertIsInstance(refined, Fp8Tensor)
                self.assertEqual(refined.block, (1, 100) if block is None else (2, 48))
                self.assertTrue(torch.equal(refined.dequantize(), torch.cat([b.dequantize(), whole_a])))
                other = fp8(16, 100, (32, 50))  # other blocks of inputs: one grid cannot hold both
                self.assertNotIsInstance(cat_rows([a, other]), Fp8Tensor)

    def test_quantize_tool_writes_what_the_writers_write(self):
        from safetensors.torch import load_file

        from rtp_llm.tools.quantize import write

        src = self.src["qwen3_gqa_untied"]
        plain = load_file(os.path.join(src, "model.safetensors"))
        oracles = {"block": lambda w: fp8_block(w, 128, 128), "channel": lambda w: fp8_channel(w, torch.float32),
                   "gptq": lambda w: gptq(w, 4, 128)}
        for scheme, oracle in oracles.items():
            with self.subTest(scheme):
                out = write(src, os.path.join(self.tmp.name, f"tool-{scheme}"), scheme)
                loaded = load_model(out, progress=False).weights
                projections = [n for n in plain if n.startswith("model.layers.") and n.endswith("_proj.weight")]
                self.assertTrue(projections)
                for name in projections:
                    self.assertIsInstance(loaded[name], GroupIntTensor if scheme == "gptq" else Fp8Tensor)
                    self.assertTrue(torch.equal(loaded[name].dequantize(), oracle(plain[name].float())[1]), name)
                embed = "model.embed_tokens.weight"
                self.assertTrue(torch.equal(loaded[embed], plain[embed].float()))

    def variant(self, case: str, tag: str, **changes) -> str:
        return rewrite_config(self.cases[case][0], os.path.join(self.tmp.name, f"{case}-{tag}"), **changes)

    def test_unsupported_configs_are_refused_at_start_up_naming_the_field(self):
        for case, changes, field in (
                ("gptq_sym", dict(quant_method="bitsandbytes"), r"quant_method = 'bitsandbytes'.*supported: fp8"),
                ("gptq_sym", dict(quant_method="hqq"), r"quant_method = 'hqq'"),
                ("gptq_sym", dict(bits=3), r"quantization_config.bits = 3 .*'gptq'.*bits 4 or 8"),
                ("gptq_sym", dict(checkpoint_format="marlin"), r"quantization_config.checkpoint_format = 'marlin'"),
                ("gptq_sym", dict(dynamic={"-:.*down": {}}), r"quantization_config.dynamic"),
                ("awq_gemm", dict(version="gemv"), r"quantization_config.version = 'gemv' .*'awq'.*version gemm"),
                ("awq_gemm", dict(zero_point=False), r"quantization_config.zero_point = False"),
                ("fp8_block_48x80", dict(fmt="e5m2"), r"quantization_config.fmt = 'e5m2'"),
                ("fp8_block_48x80", dict(weight_block_size=[128]), r"quantization_config.weight_block_size = \[128\]"),
                ("ct_fp8_channel", dict(format="pack-quantized"), r"quantization_config.format = 'pack-quantized'"),
                ("ct_fp8_channel", dict(sparsity_config={"format": "sparse-24-bitmask"}),
                 r"quantization_config.sparsity_config")):
            with self.subTest(case, **{k: str(v) for k, v in changes.items()}):
                path = self.variant(case, "-".join(f"{k}{v}" for k, v in changes.items()).replace("/", ""), **changes)
                with self.assertRaisesRegex(CheckpointError, field):
                    read_hf_config(path)

    def test_checkpoints_that_disagree_with_their_config_are_refused(self):
        ignored = self.variant("gptq_sym", "ignores-down", modules_to_not_convert=["lm_head", "layers.1.mlp.down_proj"])
        for path, message in (
                (self.variant("fp8_block_48x80", "block64", weight_block_size=[64, 80]),
                 r"weight_scale_inv has shape \(3, (2|4)\), but quantization_config.weight_block_size = "
                 r"\[64, 80\] over its weight 128 x (128|256) gives \(2, (2|4)\)"),
                (ignored, r"down_proj is stored packed .*quantization_config.modules_to_not_convert lists it"),
                (self.variant("fp8_block_48x80", "noconfig", quant_method=None),
                 r"is float8_e4m3fn, but quantization_config.quant_method is absent"),
                (self.variant("gptq_sym", "as-awq", quant_method="awq", version="gemm", zero_point=True),
                 r"qweight is int32 \((16|32), 128\), expected int32 \((128|256), 16\) \(awq"),
                (self.variant("fp8_tensor_static", "as-channel", quant_method="fbgemm_fp8"),
                 r"weight_scale has shape \(1,\): a per-channel scale")):
            with self.subTest(path=os.path.basename(path)):
                with self.assertRaisesRegex(CheckpointError, message):
                    load_model(path, progress=False)
        old = self.variant("gptq_sym", "quantize-config-json", quant_method=None)
        with open(os.path.join(old, "quantize_config.json"), "w") as f:
            json.dump({"bits": 4, "group_size": 32, "desc_act": False}, f)
        with self.assertRaisesRegex(CheckpointError, "has quantize_config.json but config.json has no"):
            read_hf_config(old)

    def test_e8m0_scales_read_as_their_powers_of_two(self):
        from rtp_llm.model_loader.dequant import dequant_fp8
        from rtp_llm.model_loader.quant_config import parse_quant_config

        qc = parse_quant_config({"quant_method": "fp8", "weight_block_size": [2, 4], "scale_fmt": "ue8m0"}, "test")
        w = torch.randn(3, 6).to(torch.float8_e4m3fn)
        scale = torch.tensor([[0.5, 4.0], [2.0 ** -10, 8.0]])
        want = w.float() * scale.repeat_interleave(2, 0)[:3].repeat_interleave(4, 1)[:, :6]
        self.assertTrue(torch.equal(dequant_fp8(w, scale.to(torch.float8_e8m0fnu), qc, "s"), want))

    def serve(self, path: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rtp_llm.start_server", f"--checkpoint_path={path}",
                               f"--start_port={free_port()}", "--frontend_server_count=1"],
                              capture_output=True, text=True, timeout=240)

    def test_the_server_start_fails_with_the_message(self):
        # (With a tokenizer: else the frontend's refusal below could come first.)
        proc = self.serve(add_tiny_tokenizer(self.variant("awq_gemm", "server-bnb", quant_method="bitsandbytes")))
        self.assertEqual(proc.returncode, 2, proc.stderr)  # REFUSED_EXIT: the model was refused, nothing crashed
        self.assertIn("quantization_config.quant_method = 'bitsandbytes' is not supported", proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)  # one line naming the field, not a stack

    def test_a_checkpoint_without_a_tokenizer_is_refused_by_the_frontend_in_one_line(self):
        proc = self.serve(self.variant("awq_gemm", "server-no-tokenizer"))
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("it has no tokenizer: pass --tokenizer_path", proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)


if __name__ == "__main__":
    unittest.main()
