import unittest

import torch

from rtp_llm.ops import ensure_compute_ops_loaded


def reference_rms_norm(x, weight, eps):
    # HF transformers' LlamaRMSNorm / Qwen3RMSNorm.
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class RmsNormTest(unittest.TestCase):
    def setUp(self):
        self.ops = ensure_compute_ops_loaded()
        self.gen = torch.Generator().manual_seed(0)

    def test_matches_reference_fp32(self):
        x = torch.randn(7, 576, generator=self.gen)
        w = torch.randn(576, generator=self.gen)
        torch.testing.assert_close(self.ops.rms_norm(x, w, 1e-6), reference_rms_norm(x, w, 1e-6))

    def test_matches_reference_bf16(self):
        x = torch.randn(33, 896, generator=self.gen).to(torch.bfloat16)
        w = torch.randn(896, generator=self.gen).to(torch.bfloat16)
        torch.testing.assert_close(self.ops.rms_norm(x, w, 1e-6), reference_rms_norm(x, w, 1e-6))

    def test_rejects_mismatched_weight_with_a_clear_error(self):
        with self.assertRaisesRegex(RuntimeError, r"weight must be \[16\]"):
            self.ops.rms_norm(torch.zeros(2, 16), torch.zeros(8), 1e-6)


if __name__ == "__main__":
    unittest.main()
