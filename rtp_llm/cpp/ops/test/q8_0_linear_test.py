"""The Q8_0 kernels (q8_0_linear) against dequantize-then-matmul references: the exact one
(activations quantized as the kernels do, then fp64 matmul) within fp32 rounding, and the plain
one (fp32 activations) within Q8_0's activation-quantization tolerance; the AVX-512 VNNI and
portable kernels bit for bit; and the CPU backend's packed weight type on them."""

import unittest

import numpy as np
import torch

from rtp_llm.cpp.ops.test.quant_reference import dequantized, quantized_activations
from rtp_llm.ops import ensure_compute_ops_loaded

BLOCK = 32


def q8_0_blocks(w: torch.Tensor) -> torch.Tensor:
    """A GGUF Q8_0 tensor's rows (gguf's own quantizer) of an fp32 [N, K] weight."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    return torch.from_numpy(np.array(quantize(w.numpy(), GGMLQuantizationType.Q8_0)))


class Q8_0LinearTest(unittest.TestCase):
    def setUp(self):
        self.ops = ensure_compute_ops_loaded()
        self.gen = torch.Generator().manual_seed(0)

    def case(self, m, n, k):
        w = torch.randn(n, k, generator=self.gen) * 0.05
        blocks = q8_0_blocks(w)
        x = torch.randn(m, k, generator=self.gen)
        return x, blocks, dequantized("Q8_0", blocks, (n, k)), self.ops.pack_q8_0_linear(blocks)

    def test_matches_dequantize_then_matmul(self):
        # K = 352: 11 blocks, not a multiple of 256; N = 37 and 151: odd, a padded column group;
        # M = 300: a full 256-row panel, then 44 rows (5 tiles of 8, one of 4).
        for m, n, k in [(1, 37, 352), (3, 37, 352), (16, 37, 352), (64, 37, 352), (64, 151, 224), (300, 151, 96)]:
            x, _, wd, packed = self.case(m, n, k)
            y = self.ops.q8_0_linear(x, packed, n)
            self.assertEqual(tuple(y.shape), (m, n))
            exact = quantized_activations(x, BLOCK) @ wd.double().T
            torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5, msg=f"M={m} N={n} K={k}")
            plain = x.double() @ wd.double().T
            rel = ((y.double() - plain).norm() / plain.norm()).item()
            # Activations rounded to 1/254 of their block's max: ~0.5% of the output's norm.
            self.assertLess(rel, 1e-2, f"M={m} N={n} K={k}: relative error {rel}")

    def test_vectorized_and_portable_agree_bit_for_bit(self):
        for m in (1, 3, 16, 64):
            x, _, _, packed = self.case(m, 37, 352)
            fast = self.ops.q8_0_linear(x, packed, 37)
            slow = self.ops.q8_0_linear(x, packed, 37, portable=True)
            self.assertTrue(torch.equal(fast, slow), f"M={m}: max diff {(fast - slow).abs().max()}")

    def test_bf16_rows_and_out(self):
        x, _, _, packed = self.case(5, 37, 352)
        xb = x.to(torch.bfloat16)
        want = self.ops.q8_0_linear(xb.float(), packed, 37).to(torch.bfloat16)
        self.assertTrue(torch.equal(self.ops.q8_0_linear(xb, packed, 37), want))
        out = torch.empty(5, 37, dtype=torch.bfloat16)
        self.assertIs(self.ops.q8_0_linear(xb, packed, 37, out), out)
        self.assertTrue(torch.equal(out, want))
        self.assertEqual(tuple(self.ops.q8_0_linear(xb[:0], packed, 37).shape), (0, 37))

    def test_packed_size_is_the_file_size_plus_one_seventeenth(self):
        _, blocks, _, packed = self.case(1, 64, 352)
        self.assertEqual(packed.numel(), blocks.numel() * 576 // 544)  # 36 vs 34 bytes per 32 weights

    def test_rejects_bad_operands_with_clear_errors(self):
        x, blocks, _, packed = self.case(2, 37, 352)
        with self.assertRaisesRegex(RuntimeError, "x has K = 320, the weight 352"):
            self.ops.q8_0_linear(x[:, :320], packed, 37)
        with self.assertRaisesRegex(RuntimeError, "pack_q8_0_linear of an \\[n = 64"):
            self.ops.q8_0_linear(x, packed, 64)
        with self.assertRaisesRegex(RuntimeError, "uint8 \\[N, K / 32 \\* 34\\]"):
            self.ops.pack_q8_0_linear(blocks[:, :33])


class CpuBackendQ8_0Test(unittest.TestCase):
    """The backend keeps a loader's Q8_0Tensor quantized and runs its projections on it."""

    def test_linear_gate_up_and_lm_head(self):
        from rtp_llm.device.cpu.backend import CpuBackend
        from rtp_llm.device.cpu.q8_0 import Q8_0Linear
        from rtp_llm.model_loader.quantized import Q8_0Tensor

        be, gen = CpuBackend(), torch.Generator().manual_seed(1)
        w = torch.randn(64, 96, generator=gen) * 0.05
        blocks = q8_0_blocks(w)
        t = Q8_0Tensor.from_gguf(blocks.numpy(), (64, 96), torch.bfloat16)
        self.assertTrue(be.keeps_quantized(t))
        x = torch.randn(4, 96, generator=gen).to(torch.bfloat16)
        ref = (quantized_activations(x.float(), BLOCK) @ dequantized("Q8_0", blocks, (64, 96)).double().T).float()
        for packed in (be.pack_linear(t), be.pack_lm_head(t)):
            self.assertIsInstance(packed, Q8_0Linear)
            torch.testing.assert_close(be.linear(x, packed).float(), ref.to(torch.bfloat16).float())
        torch.testing.assert_close(be.lm_head(x, be.pack_lm_head(t)), be.linear(x, be.pack_linear(t)))
        gate_up = be.pack_gate_up(t)
        want = be.silu_and_mul(be.linear(x, gate_up))
        self.assertTrue(torch.equal(be.gate_up_silu(x, gate_up), want))


if __name__ == "__main__":
    unittest.main()
