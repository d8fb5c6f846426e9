"""The Q4_K / Q5_K / Q6_K kernels (q4_k_linear, q5_k_linear, q6_k_linear) against dequantize-then-matmul references
(gguf's own dequantizer of the file's blocks): the exact one (activations quantized per 256 as
the kernels do, then fp64 matmul) within fp32 rounding, and the plain one (fp32 activations)
within the int8 activations' tolerance; the AVX-512 VNNI and portable kernels bit for bit; and
the CPU backend's packed weight type on them. gguf's Python package has no k-quant quantizer,
so the blocks are random bytes with bounded fp16 super-block scales (every bit pattern of the
other fields is a valid block)."""

import unittest

import numpy as np
import torch

from rtp_llm.cpp.ops.test.quant_reference import dequantized, quantized_activations
from rtp_llm.ops import ensure_compute_ops_loaded

SUPER = 256
FORMATS = {  # name: (bytes per 256 weights, byte offsets of the fp16 super-block scales)
    "Q4_K": (144, (0, 2)),
    "Q5_K": (176, (0, 2)),
    "Q6_K": (210, (208,)),
}


def random_blocks(fmt: str, n: int, k: int, gen: np.random.Generator) -> torch.Tensor:
    nbytes, scale_offsets = FORMATS[fmt]
    blocks = gen.integers(0, 256, size=(n, k // SUPER, nbytes), dtype=np.uint8)
    for off in scale_offsets:  # d (and Q4_K's dmin) in [0.5e-4, 1.5e-4]: weights of ~0.01-0.1
        d = (gen.random((n, k // SUPER)) * 1e-4 + 0.5e-4).astype(np.float16)
        blocks[:, :, off:off + 2] = d.view(np.uint8).reshape(n, k // SUPER, 2)
    return torch.from_numpy(blocks.reshape(n, -1).copy())


class KQuantLinearTest(unittest.TestCase):
    def setUp(self):
        self.ops = ensure_compute_ops_loaded()
        self.gen = np.random.default_rng(0)

    def ops_of(self, fmt):
        stem = fmt.lower()
        return getattr(self.ops, f"pack_{stem}_linear"), getattr(self.ops, f"{stem}_linear")

    def case(self, fmt, m, n, k):
        pack, _ = self.ops_of(fmt)
        blocks = random_blocks(fmt, n, k, self.gen)
        x = torch.from_numpy(self.gen.standard_normal((m, k)).astype(np.float32))
        return x, blocks, dequantized(fmt, blocks, (n, k)), pack(blocks)

    def test_matches_dequantize_then_matmul(self):
        # N = 37 and 151: odd, a padded column group; M = 1..5: tiles of 1 to 4 rows and 4 + 1;
        # M = 300: a full 256-row panel, then 44 rows; K up to 1280 (5 super-blocks).
        for fmt in FORMATS:
            _, linear = self.ops_of(fmt)
            for m, n, k in [(1, 37, 256), (3, 37, 768), (4, 16, 512), (5, 37, 1280), (64, 151, 512), (300, 151, 256)]:
                x, _, wd, packed = self.case(fmt, m, n, k)
                y = linear(x, packed, n)
                self.assertEqual(tuple(y.shape), (m, n))
                exact = quantized_activations(x, SUPER) @ wd.double().T
                scale = exact.abs().max().item()
                torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5 * scale,
                                           msg=f"{fmt} M={m} N={n} K={k}")
                plain = x.double() @ wd.double().T
                rel = ((y.double() - plain).norm() / plain.norm()).item()
                # Activations rounded to 1/254 of their 256-block's max (~3 sigma): ~0.7% of the
                # output's norm.
                self.assertLess(rel, 2e-2, f"{fmt} M={m} N={n} K={k}: relative error {rel}")

    def test_vectorized_and_portable_agree_bit_for_bit(self):
        for fmt in FORMATS:
            _, linear = self.ops_of(fmt)
            for m in (1, 3, 4, 5, 16, 64):
                x, _, _, packed = self.case(fmt, m, 37, 768)
                fast = linear(x, packed, 37)
                slow = linear(x, packed, 37, portable=True)
                self.assertTrue(torch.equal(fast, slow), f"{fmt} M={m}: max diff {(fast - slow).abs().max()}")

    def test_zero_blocks_give_zero(self):
        # An all-zero activation block has d = 0 (no 1 / 0) and contributes exactly 0.
        for fmt in FORMATS:
            _, linear = self.ops_of(fmt)
            x, _, _, packed = self.case(fmt, 2, 37, 512)
            x[0] = 0
            x[1, :SUPER] = 0
            y = linear(x, packed, 37)
            self.assertTrue(torch.equal(y[0], torch.zeros(37)), fmt)
            self.assertTrue(torch.isfinite(y[1]).all(), fmt)

    def test_bf16_rows_and_out(self):
        for fmt in FORMATS:
            _, linear = self.ops_of(fmt)
            x, _, _, packed = self.case(fmt, 5, 37, 512)
            xb = x.to(torch.bfloat16)
            want = linear(xb.float(), packed, 37).to(torch.bfloat16)
            self.assertTrue(torch.equal(linear(xb, packed, 37), want))
            out = torch.empty(5, 37, dtype=torch.bfloat16)
            self.assertIs(linear(xb, packed, 37, out), out)
            self.assertTrue(torch.equal(out, want))
            self.assertEqual(tuple(linear(xb[:0], packed, 37).shape), (0, 37))

    def test_packed_size(self):
        # Per 16 columns x 256 weights: Q4_K 2368 bytes (the file's 2304), Q5_K 2880 (2816), Q6_K
        # 3392 (3360).
        for fmt, record in (("Q4_K", 2368), ("Q5_K", 2880), ("Q6_K", 3392)):
            _, blocks, _, packed = self.case(fmt, 1, 64, 512)
            self.assertEqual(tuple(packed.shape), (4, 2, record), fmt)
            self.assertLess(packed.numel(), blocks.numel() * 1.03, fmt)

    def test_rejects_bad_operands_with_clear_errors(self):
        for fmt in FORMATS:
            pack, linear = self.ops_of(fmt)
            stem = fmt.lower()
            x, blocks, _, packed = self.case(fmt, 2, 37, 512)
            with self.assertRaisesRegex(RuntimeError, f"{stem}_linear: x has K = 256, the weight 512"):
                linear(x[:, :256], packed, 37)
            with self.assertRaisesRegex(RuntimeError, f"pack_{stem}_linear of an \\[n = 64"):
                linear(x, packed, 64)
            with self.assertRaisesRegex(RuntimeError, f"uint8 \\[N, K / 256 \\* {FORMATS[fmt][0]}\\]"):
                pack(blocks[:, :100])
        q6_k_packed = self.case("Q6_K", 1, 16, 256)[3]
        with self.assertRaisesRegex(RuntimeError, "must come from pack_q4_k_linear"):  # a Q6_K weight, Q4_K op
            self.ops.q4_k_linear(torch.zeros(1, 256), q6_k_packed, 16)


class CpuBackendKQuantTest(unittest.TestCase):
    """The backend keeps a loader's Q4_KTensor / Q5_KTensor / Q6_KTensor quantized and runs its projections on it."""

    def test_linear_gate_up_and_lm_head(self):
        from rtp_llm.device.cpu.backend import CpuBackend
        from rtp_llm.device.cpu.kquant import KQuantLinear
        from rtp_llm.model_loader.quantized import Q4_KTensor, Q5_KTensor, Q6_KTensor

        be, gen = CpuBackend(), np.random.default_rng(1)
        for cls in (Q4_KTensor, Q5_KTensor, Q6_KTensor):
            blocks = random_blocks(cls.QTYPE, 64, 512, gen)
            t = cls.from_gguf(blocks.numpy(), (64, 512), torch.bfloat16)
            self.assertTrue(be.keeps_quantized(t))
            x = torch.from_numpy(gen.standard_normal((4, 512)).astype(np.float32)).to(torch.bfloat16)
            w = dequantized(cls.QTYPE, blocks, (64, 512))
            ref = (quantized_activations(x.float(), SUPER) @ w.double().T).float()
            for packed in (be.pack_linear(t), be.pack_lm_head(t)):
                self.assertIsInstance(packed, KQuantLinear)
                torch.testing.assert_close(be.linear(x, packed).float(), ref.to(torch.bfloat16).float())
            torch.testing.assert_close(be.lm_head(x, be.pack_lm_head(t)), be.linear(x, be.pack_linear(t)))
            gate_up = be.pack_gate_up(t)
            want = be.silu_and_mul(be.linear(x, gate_up))
            self.assertTrue(torch.equal(be.gate_up_silu(x, gate_up), want))


class QuantizedTensorTest(unittest.TestCase):
    """The loader-side Q4_KTensor / Q5_KTensor / Q6_KTensor: slicing, stacking and widening keep the weights."""

    def test_rows_cols_cat_and_take(self):
        from rtp_llm.model_loader.quantized import Q4_KTensor, Q5_KTensor, Q6_KTensor, Q8_0Tensor, cat_rows, take

        gen = np.random.default_rng(2)
        for cls in (Q4_KTensor, Q5_KTensor, Q6_KTensor):
            blocks = random_blocks(cls.QTYPE, 8, 768, gen)
            t = cls.from_gguf(blocks.numpy(), (8, 768), torch.float32)
            full = t.dequantize()
            self.assertTrue(torch.equal(full, dequantized(cls.QTYPE, blocks, (8, 768))))
            self.assertTrue(torch.equal(t.rows(2, 3).dequantize(), full[2:5]))
            self.assertTrue(torch.equal(t.cols(256, 512).dequantize(), full[:, 256:]))
            self.assertTrue(torch.equal(t.pad_rows(2).dequantize()[8:], torch.zeros(2, 768)))
            stacked = cat_rows([t.rows(0, 3), t.rows(3, 5)])
            self.assertIsInstance(stacked, cls)
            self.assertTrue(torch.equal(stacked.dequantize(), full))
            # A split that cuts 256-blocks (tensor parallel over 384 inputs) is widened, not wrong.
            half = take(t, cols=(0, 384))
            self.assertIsInstance(half, torch.Tensor)
            self.assertTrue(torch.equal(half, full[:, :384]))
            with self.assertRaisesRegex(ValueError, f"a {cls.QTYPE} weight splits along its input only at multiples of 256"):
                t.cols(0, 384)
        # Mixed formats (a Q4_K_M file's q/k/v) are widened when stacked.
        q8 = Q8_0Tensor(torch.zeros(2, 768 // 32 * 34, dtype=torch.uint8), (2, 768), torch.float32)
        mixed = cat_rows([Q4_KTensor.from_gguf(random_blocks("Q4_K", 2, 768, gen).numpy(), (2, 768), torch.float32), q8])
        self.assertIsInstance(mixed, torch.Tensor)
        self.assertEqual(tuple(mixed.shape), (4, 768))
        self.assertTrue(torch.equal(mixed[2:], torch.zeros(2, 768)))


if __name__ == "__main__":
    unittest.main()
