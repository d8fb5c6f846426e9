"""The 32-block kernels (q8_0_linear, on weights packed from Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1
blocks) against dequantize-then-matmul references (gguf's own quantizer and dequantizer): the
exact one (activations quantized as the kernels do, then fp64 matmul) within fp32 rounding, and
the plain one (fp32 activations) within the int8 activations' tolerance; the AVX-512 VNNI and
portable kernels bit for bit; and the CPU backend's packed weight type on them."""

import unittest

import numpy as np
import torch

from rtp_llm.cpp.ops.test.quant_reference import dequantized, quantized_activations
from rtp_llm.ops import ensure_compute_ops_loaded

BLOCK = 32
# name: (file bytes per 32 weights, packed record bytes per 16 columns x 32 weights)
FORMATS = {"Q8_0": (34, 576), "Q4_0": (18, 320), "Q4_1": (20, 384), "Q5_0": (22, 384), "Q5_1": (24, 448)}
WITH_MIN = ("Q4_1", "Q5_1")


def gguf_blocks(w: torch.Tensor, fmt: str = "Q8_0") -> torch.Tensor:
    """A GGUF tensor's rows in format `fmt` (gguf's own quantizer) of an fp32 [N, K] weight."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    return torch.from_numpy(np.array(quantize(w.numpy(), GGMLQuantizationType[fmt])))


class Q8_0LinearTest(unittest.TestCase):
    def setUp(self):
        self.ops = ensure_compute_ops_loaded()
        self.gen = torch.Generator().manual_seed(0)

    def case(self, m, n, k, fmt="Q8_0"):
        w = torch.randn(n, k, generator=self.gen) * 0.05
        if fmt in WITH_MIN:  # formats with a min: weights of one sign in places (m far from 0)
            w = w + torch.rand(n, 1, generator=self.gen) * 0.05
        blocks = gguf_blocks(w, fmt)
        x = torch.randn(m, k, generator=self.gen)
        pack = getattr(self.ops, f"pack_{fmt.lower()}_linear")
        return x, blocks, dequantized(fmt, blocks, (n, k)), pack(blocks)

    def test_matches_dequantize_then_matmul(self):
        # K = 352: 11 blocks, not a multiple of 256; N = 37 and 151: odd, a padded column group;
        # M = 300: a full 256-row panel, then 44 rows (5 tiles of 8, one of 4).
        for fmt in FORMATS:
            for m, n, k in [(1, 37, 352), (3, 37, 352), (16, 37, 352), (64, 37, 352), (64, 151, 224), (300, 151, 96)]:
                x, _, wd, packed = self.case(m, n, k, fmt)
                y = self.ops.q8_0_linear(x, packed, n, fmt)
                self.assertEqual(tuple(y.shape), (m, n))
                exact = quantized_activations(x, BLOCK) @ wd.double().T
                torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5, msg=f"{fmt} M={m} N={n} K={k}")
                plain = x.double() @ wd.double().T
                rel = ((y.double() - plain).norm() / plain.norm()).item()
                # Activations rounded to 1/254 of their block's max: ~0.5% of the output's norm.
                self.assertLess(rel, 1e-2, f"{fmt} M={m} N={n} K={k}: relative error {rel}")

    def test_vectorized_and_portable_agree_bit_for_bit(self):
        for fmt in FORMATS:
            for m in (1, 3, 16, 64):
                x, _, _, packed = self.case(m, 37, 352, fmt)
                fast = self.ops.q8_0_linear(x, packed, 37, fmt)
                slow = self.ops.q8_0_linear(x, packed, 37, fmt, portable=True)
                self.assertTrue(torch.equal(fast, slow), f"{fmt} M={m}: max diff {(fast - slow).abs().max()}")

    def test_zero_rows_give_zero(self):
        # An all-zero activation block has d = 0 (no 1 / 0) and sum 0: the mins add nothing.
        for fmt in FORMATS:
            x, _, _, packed = self.case(2, 37, 352, fmt)
            x[0] = 0
            y = self.ops.q8_0_linear(x, packed, 37, fmt)
            self.assertTrue(torch.equal(y[0], torch.zeros(37)), fmt)

    def test_bf16_rows_and_out(self):
        for fmt in FORMATS:
            x, _, _, packed = self.case(5, 37, 352, fmt)
            xb = x.to(torch.bfloat16)
            want = self.ops.q8_0_linear(xb.float(), packed, 37, fmt).to(torch.bfloat16)
            self.assertTrue(torch.equal(self.ops.q8_0_linear(xb, packed, 37, fmt), want), fmt)
            out = torch.empty(5, 37, dtype=torch.bfloat16)
            self.assertIs(self.ops.q8_0_linear(xb, packed, 37, fmt, out), out)
            self.assertTrue(torch.equal(out, want), fmt)
            self.assertEqual(tuple(self.ops.q8_0_linear(xb[:0], packed, 37, fmt).shape), (0, 37))

    def test_packed_size_is_the_file_size_plus_one_seventeenth(self):
        _, blocks, _, packed = self.case(1, 64, 352)
        self.assertEqual(packed.numel(), blocks.numel() * 576 // 544)  # 36 vs 34 bytes per 32 weights

    def test_packed_size_of_each_format(self):
        # One record per 16 columns and 32-block (q8_0.h): Q4_0 320 / 288 of the file's bytes,
        # Q4_1 384 / 320, Q5_0 384 / 352, Q5_1 448 / 384 (nibbles, a 5th-bit plane, whole lines).
        for fmt, (file_bytes, record) in FORMATS.items():
            _, blocks, _, packed = self.case(1, 64, 352, fmt)
            self.assertEqual(tuple(packed.shape), (4, 11, record), fmt)
            self.assertEqual(packed.numel() * file_bytes * 16, blocks.numel() * record, fmt)

    def test_no_min_formats_compute_as_their_q8_0_blocks(self):
        # Q4_0 and Q5_0 are Q8_0 blocks exactly (d, q - zero): the loader stacks mixed q/k/v so,
        # and their narrow records unpack to the very q of the Q8_0 record: the same bits out.
        from rtp_llm.model_loader.quantized import KEPT_FORMATS

        for fmt in ("Q4_0", "Q5_0"):
            x, blocks, wd, packed = self.case(9, 37, 352, fmt)
            q8 = KEPT_FORMATS[fmt].from_gguf(blocks.numpy(), (37, 352), torch.float32).to_q8_0()
            self.assertTrue(torch.equal(q8.dequantize(), wd), fmt)
            wide = self.ops.pack_q8_0_linear(q8.blocks)
            for portable in (False, True):
                self.assertTrue(torch.equal(self.ops.q8_0_linear(x, packed, 37, fmt, portable=portable),
                                            self.ops.q8_0_linear(x, wide, 37, "Q8_0", portable=portable)), fmt)

    def test_rejects_bad_operands_with_clear_errors(self):
        x, blocks, _, packed = self.case(2, 37, 352)
        with self.assertRaisesRegex(RuntimeError, "x has K = 320, the weight 352"):
            self.ops.q8_0_linear(x[:, :320], packed, 37, "Q8_0")
        with self.assertRaisesRegex(RuntimeError, "pack_q8_0_linear of an \\[n = 64"):
            self.ops.q8_0_linear(x, packed, 64, "Q8_0")
        with self.assertRaisesRegex(RuntimeError, "pack_q4_1_linear of an \\[n = 37"):  # a Q8_0 weight as Q4_1
            self.ops.q8_0_linear(x, packed, 37, "Q4_1")
        with self.assertRaisesRegex(RuntimeError, "qtype must be Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1, got 'Q4_K'"):
            self.ops.q8_0_linear(x, packed, 37, "Q4_K")
        with self.assertRaisesRegex(RuntimeError, "uint8 \\[N, K / 32 \\* 34\\]"):
            self.ops.pack_q8_0_linear(blocks[:, :33])
        for fmt, (file_bytes, _) in FORMATS.items():
            blocks = self.case(1, 37, 352, fmt)[1]
            with self.assertRaisesRegex(RuntimeError, f"pack_{fmt.lower()}_linear: blocks must be a uint8 "
                                                      f"\\[N, K / 32 \\* {file_bytes}\\] on the CPU \\(a GGUF {fmt}"):
                getattr(self.ops, f"pack_{fmt.lower()}_linear")(blocks[:, :file_bytes + 1])


class CpuBackendQ8_0Test(unittest.TestCase):
    """The backend keeps a loader's Q8_0Tensor (Q4_0Tensor, ...) quantized and runs its projections on it."""

    def test_linear_gate_up_and_lm_head(self):
        from rtp_llm.device.cpu.backend import CpuBackend
        from rtp_llm.device.cpu.q8_0 import Q8_0Linear
        from rtp_llm.model_loader.quantized import KEPT_FORMATS

        be, gen = CpuBackend(), torch.Generator().manual_seed(1)
        for fmt in FORMATS:
            w = torch.randn(64, 96, generator=gen) * 0.05
            blocks = gguf_blocks(w, fmt)
            t = KEPT_FORMATS[fmt].from_gguf(blocks.numpy(), (64, 96), torch.bfloat16)
            self.assertTrue(be.keeps_quantized(t), fmt)
            x = torch.randn(4, 96, generator=gen).to(torch.bfloat16)
            ref = (quantized_activations(x.float(), BLOCK) @ dequantized(fmt, blocks, (64, 96)).double().T).float()
            for packed in (be.pack_linear(t), be.pack_lm_head(t)):
                self.assertIsInstance(packed, Q8_0Linear)
                self.assertEqual(packed.qtype, fmt)
                torch.testing.assert_close(be.linear(x, packed).float(), ref.to(torch.bfloat16).float(), msg=fmt)
            torch.testing.assert_close(be.lm_head(x, be.pack_lm_head(t)), be.linear(x, be.pack_linear(t)))
            gate_up = be.pack_gate_up(t)
            want = be.silu_and_mul(be.linear(x, gate_up))
            self.assertTrue(torch.equal(be.gate_up_silu(x, gate_up), want), fmt)


if __name__ == "__main__":
    unittest.main()
