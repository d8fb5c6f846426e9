"""GroupIntTensor (model_loader/int_weight.py), a GPTQ / AWQ weight kept packed: built from a
checkpoint's unpacked codes it dequantizes to exactly dequant.py's values (in input order, a
desc_act weight's shuffled groups included), and slicing and stacking it give the slices and
stacks of those values, or widen where the packing cannot express them."""

import unittest

import torch

from rtp_llm.model_loader.dequant import Codes, dequant_codes
from rtp_llm.model_loader.int_weight import GroupIntTensor, from_codes, pack_rows, unpack_rows
from rtp_llm.model_loader.quantized import cat_rows, take


def codes(n, k, bits, group, shuffled=False, seed=0, scale_dtype=torch.float16):
    """Random GPTQ-like codes of an [N, K] weight: (Codes in [K, N] orientation, group size)."""
    g = torch.Generator().manual_seed(seed)
    groups = -(-k // group)
    group_of_k = torch.arange(k) // group
    if shuffled:  # desc_act: inputs taken in a random order, `group` of them a group
        perm = torch.randperm(k, generator=g)
        group_of_k = torch.empty(k, dtype=torch.long)
        group_of_k[perm] = torch.arange(k) // group
    top = 1 << bits
    return Codes(torch.randint(0, top, (k, n), generator=g, dtype=torch.int32),
                 torch.randint(0, top, (groups, n), generator=g, dtype=torch.int32),
                 (torch.rand(groups, n, generator=g) * 0.01 + 1e-3).to(scale_dtype), group_of_k)


def kept(c, group, bits, dtype=torch.float32):
    return from_codes(c.codes, c.zeros, c.scales, c.group_of_k, group, bits, dtype)


class GroupIntTensorTest(unittest.TestCase):
    def test_rows_pack_and_unpack(self):
        for bits in (4, 8):
            q = torch.randint(0, 1 << bits, (5, 64), dtype=torch.int32)
            words = pack_rows(q, bits)
            self.assertEqual(tuple(words.shape), (5, 64 * bits // 32))
            self.assertTrue(torch.equal(unpack_rows(words, bits), q))

    def test_dequantizes_to_the_checkpoint_formats_values(self):
        for bits, group, shuffled, k in ((4, 32, False, 128), (4, 32, True, 128), (8, 64, False, 192),
                                         (4, 48, False, 128), (4, 128, False, 128), (8, 32, True, 96)):
            with self.subTest(bits=bits, group=group, shuffled=shuffled):
                c = codes(40, k, bits, group, shuffled)
                t = kept(c, group, bits)
                self.assertEqual(t.perm is not None, shuffled)
                self.assertTrue(torch.equal(t.dequantize(), dequant_codes(c)))
                bf16 = kept(c, group, bits, torch.bfloat16).dequantize()
                self.assertTrue(torch.equal(bf16, dequant_codes(c).to(torch.bfloat16)))

    def test_groups_that_are_no_runs_of_the_group_size_are_not_kept(self):
        c = codes(16, 64, 4, 32)
        odd = c._replace(group_of_k=torch.tensor([0, 1] * 32))  # 32 inputs a group, but not as GPTQ assigns them
        self.assertIsNone(kept(odd, 16, 4))  # 16 a group asked: the groups are 32 wide
        self.assertIsNotNone(kept(odd, 32, 4))  # a shuffle of 32-input groups: kept, through perm

    def test_slices_and_stacks_are_those_of_the_values(self):
        for shuffled in (False, True):
            c = codes(48, 128, 4, 32, shuffled, seed=1)
            a = kept(c, 32, 4)
            whole = a.dequantize()
            for rows, cols in (((8, 16), None), (None, (32, 64)), ((0, 24), (64, 64)), (None, (40, 48))):
                with self.subTest(shuffled=shuffled, rows=rows, cols=cols):
                    want = whole[rows[0]:sum(rows)] if rows else whole
                    want = want[:, cols[0]:sum(cols)] if cols else want
                    got = take(a, rows, cols)
                    aligned = cols is None or (not shuffled and cols[0] % 32 == 0)
                    self.assertEqual(isinstance(got, GroupIntTensor), aligned)
                    self.assertTrue(torch.equal(got.dequantize() if aligned else got, want))
            with self.subTest(shuffled=shuffled, stack=True):
                b = kept(c._replace(codes=c.codes.flip(1)), 32, 4)  # the same input order, other codes
                joined = cat_rows([a, b])
                self.assertIsInstance(joined, GroupIntTensor)
                self.assertTrue(torch.equal(joined.dequantize(), torch.cat([whole, b.dequantize()])))
                padded = a.pad_rows(3).dequantize()
                self.assertTrue(torch.equal(padded[:48], whole) and not padded[48:].any())
        other_order = kept(codes(16, 128, 4, 32, True, seed=2), 32, 4)
        plain_order = kept(codes(16, 128, 4, 32, False, seed=2), 32, 4)
        for parts in ([other_order, kept(codes(16, 128, 4, 32, True, seed=3), 32, 4)], [other_order, plain_order],
                      [plain_order, kept(codes(16, 128, 4, 64, seed=2), 64, 4)]):
            joined = cat_rows(parts)  # input orders or groups differ: widened, the same values
            self.assertNotIsInstance(joined, GroupIntTensor)
            self.assertTrue(torch.equal(joined, torch.cat([p.dequantize() for p in parts])))

    def test_one_group_a_row_splits_at_any_word(self):
        c = codes(8, 96, 4, 96)
        t = kept(c, 96, 4)
        half = take(t, cols=(48, 48))
        self.assertIsInstance(half, GroupIntTensor)
        self.assertTrue(torch.equal(half.dequantize(), t.dequantize()[:, 48:]))


if __name__ == "__main__":
    unittest.main()
