"""GGUF Q4_K / Q6_K kept quantized on the CPU, on the tiny fixtures written as llama.cpp's
mixes are (testlib.write_gguf): every matrix Q8_0 but ffn_down, Q4_K in one model and Q6_K in
the other (the only projection whose inputs, 256, are a multiple of the k-quants' 256-block).
The loader keeps the down blocks, the backend packs them (the file's bytes x 2368 / 2304 or
3392 / 3360, no bf16 copy), and the quantized bf16 path's next tokens follow the fp32 path on
the same weights dequantized."""

import os
import tempfile
import unittest

import torch

from rtp_llm.test.fp32_agreement import teacher_forced
from rtp_llm.test.testlib import add_tiny_tokenizer, make_tiny, random_prompts, write_gguf

# model: (the down projections' type, packed bytes per file byte)
MODELS = {"llama_mha_untied": ("Q4_K", 2368 / 2304), "qwen2_mqa_tied": ("Q6_K", 3392 / 3360)}
NEW_TOKENS = 64


class GgufKQuantTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.files = {}
        for name, (qtype, _) in MODELS.items():
            hf = add_tiny_tokenizer(make_tiny(name, cls.tmp.name))
            path = os.path.join(cls.tmp.name, f"{name}.{qtype}.gguf")
            cls.files[name] = (write_gguf(hf, path, qtypes={"mlp.down_proj.weight": qtype}), hf)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_loader_keeps_down_in_its_k_quant(self):
        from rtp_llm.model_loader import load_model
        from rtp_llm.model_loader.quantized import KEPT_FORMATS

        for name, (path, hf) in self.files.items():
            q = load_model(path, dtype=torch.bfloat16, tokenizer_path=hf, progress=False)
            ref = load_model(path, dtype=torch.float32, tokenizer_path=hf, progress=False)
            downs = [n for n in ref.weights if n.endswith("down_proj.weight")]
            self.assertTrue(downs)
            for n in downs:
                self.assertIs(type(q.weights[n]), KEPT_FORMATS[MODELS[name][0]], f"{name} {n}")
                self.assertTrue(torch.equal(q.weights[n].dequantize().float(), ref.weights[n].to(torch.bfloat16).float()),
                                f"{name} {n}")

    def test_packed_down_is_the_files_bytes(self):
        import gguf

        from rtp_llm.device.cpu.backend import CpuBackend
        from rtp_llm.device.cpu.kquant import KQuantLinear
        from rtp_llm.model_loader import load_model
        from rtp_llm.models_py.decoder import DecoderModel

        for name, (path, hf) in self.files.items():
            qtype, ratio = MODELS[name]
            file_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if t.name.endswith("ffn_down.weight"))
            loaded = load_model(path, dtype=torch.bfloat16, tokenizer_path=hf, progress=False)
            model = DecoderModel(loaded.config, loaded.weights, CpuBackend(), 64)
            downs = [l.down for l in model.layers]
            self.assertTrue(all(isinstance(d, KQuantLinear) and d.stem == qtype.lower() for d in downs), name)
            self.assertEqual(sum(d.nbytes for d in downs), round(file_bytes * ratio), name)

    def test_next_tokens_follow_the_dequantized_fp32_path(self):
        # Teacher-forced, as gguf_q8_0_test (free-running greedy text of these random tiny
        # models is chaotic): after each prefix of the fp32 path's greedy continuation, the
        # quantized bf16 path's next token. Measured: 89.6-90.1% (llama), 90.1-91.7% (qwen2, its
        # tied head quantized too) (the all-Q8_0 files of gguf_q8_0_test: 90-96%); a broken
        # kernel or layout gives ~1/512.
        prompts = random_prompts(7, [5, 40, 130])
        for name, (path, hf) in self.files.items():
            reading = teacher_forced(path, prompts, NEW_TOKENS, f"{name} ({MODELS[name][0]} down) bf16", hf, 64)
            self.assertGreaterEqual(reading.share, 0.85, name)


if __name__ == "__main__":
    unittest.main()
