"""GGUF Q8_0 kept quantized on the CPU, on the tiny fixtures written as Q8_0 GGUF files
(testlib.write_gguf): the loader keeps the projections' blocks (q/k rows unpermuted as the
widened path's), the backend's packed weights are the file's bytes (+1/17) with no bf16 copy,
and the quantized bf16 path's next tokens follow the fp32 path on the same weights dequantized
(the HF-parity reference)."""

import os
import tempfile
import unittest

import torch

from rtp_llm.test.testlib import add_tiny_tokenizer, make_tiny, random_prompts, teacher_forced_agreement, write_gguf

# Llama MHA untied: permuted q/k rows and a quantized LM head; Qwen2 MQA tied: q/k/v bias, the
# LM head from the (widened) embedding table.
MODELS = ("llama_mha_untied", "qwen2_mqa_tied")
NEW_TOKENS = 64


class GgufQ8_0Test(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.files = {}
        for name in MODELS:
            hf = add_tiny_tokenizer(make_tiny(name, cls.tmp.name))
            cls.files[name] = (write_gguf(hf, os.path.join(cls.tmp.name, name + ".q8_0.gguf")), hf)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_loader_keeps_projections_quantized_and_unpermuted(self):
        from rtp_llm.model_loader import load_model
        from rtp_llm.model_loader.quantized import Q8_0Tensor

        for name, (path, hf) in self.files.items():
            q = load_model(path, dtype=torch.bfloat16, tokenizer_path=hf, progress=False)
            ref = load_model(path, dtype=torch.float32, tokenizer_path=hf, progress=False)
            kept = sorted(n for n, t in q.weights.items() if isinstance(t, Q8_0Tensor))
            want = sorted(n for n in ref.weights if n.endswith("_proj.weight") or n == "lm_head.weight")
            self.assertEqual(kept, want, name)
            self.assertFalse(isinstance(q.weights["model.embed_tokens.weight"], Q8_0Tensor))
            for n in kept:  # the same weights as the fp32 (widened) load, q/k rows included
                self.assertTrue(torch.equal(q.weights[n].dequantize().float(), ref.weights[n].to(torch.bfloat16).float()),
                                f"{name} {n}")

    def test_packed_weights_are_the_files_bytes(self):
        import gguf

        from rtp_llm.device.cpu.backend import CpuBackend
        from rtp_llm.device.cpu.q8_0 import Q8_0Linear
        from rtp_llm.model_loader import load_model
        from rtp_llm.models_py.decoder import DecoderModel

        path, hf = self.files["llama_mha_untied"]
        file_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors
                         if t.tensor_type == gguf.GGMLQuantizationType.Q8_0 and t.name != "token_embd.weight")
        loaded = load_model(path, dtype=torch.bfloat16, tokenizer_path=hf, progress=False)
        model = DecoderModel(loaded.config, loaded.weights, CpuBackend(), 64)
        packed = [l.qkv for l in model.layers] + [l.o_proj for l in model.layers] + \
                 [l.gate_up for l in model.layers] + [l.down for l in model.layers] + [model.lm_head]
        self.assertTrue(all(isinstance(p, Q8_0Linear) for p in packed))
        # 36 bytes per 32 weights packed (int8, fp16 scale, int16 sum) vs the file's 34.
        self.assertEqual(sum(p.nbytes for p in packed), file_bytes * 36 // 34)

    def test_next_tokens_follow_the_dequantized_fp32_path(self):
        # Teacher-forced: after each prefix of the fp32 path's greedy continuation, the quantized
        # bf16 path's next token. (Free-running greedy text of these random tiny models is
        # chaotic: bf16 rounding alone, with the weights widened, departs from fp32 within 0-18
        # tokens. Measured teacher-forced agreement: Q8_0 90-95%, widened bf16 94-97%; a broken
        # kernel or row order gives ~1/512. The real-model test is tests/test_q8_0_real_model.py.)
        prompts = random_prompts(7, [5, 40, 130])
        for name, (path, hf) in self.files.items():
            agree, n = teacher_forced_agreement(path, hf, prompts, NEW_TOKENS)
            print(f"{name}: Q8_0 bf16 next tokens equal the fp32 path's at {agree:.1%} of {n} positions")
            self.assertGreaterEqual(agree, 0.85, name)


if __name__ == "__main__":
    unittest.main()
