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

    def test_matches_reference_with_a_ragged_tail_in_every_dtype(self):
        # 100 = 6 x 16 + 4: the vector kernels' masked tail.
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = torch.randn(5, 100, generator=self.gen).to(dtype)
            w = torch.randn(100, generator=self.gen).to(dtype)
            torch.testing.assert_close(self.ops.rms_norm(x, w, 1e-6), reference_rms_norm(x, w, 1e-6))

    def test_rejects_mismatched_weight_with_a_clear_error(self):
        with self.assertRaisesRegex(RuntimeError, r"weight must be \[16\]"):
            self.ops.rms_norm(torch.zeros(2, 16), torch.zeros(8), 1e-6)


def reference_paged_attention(q, k_cache, v_cache, block_tables, query_starts, context_lens, scale):
    import torch.nn.functional as F

    out = torch.empty_like(q)
    bs = k_cache.shape[1]
    for s in range(len(context_lens)):
        a, b, ctx = int(query_starts[s]), int(query_starts[s + 1]), int(context_lens[s])
        pos = torch.arange(ctx)
        slots = block_tables[s][pos // bs].long() * bs + pos % bs
        k = k_cache.reshape(-1, *k_cache.shape[2:])[slots].transpose(0, 1)[None].float()
        v = v_cache.reshape(-1, *v_cache.shape[2:])[slots].transpose(0, 1)[None].float()
        qs = q[a:b].transpose(0, 1)[None].float()
        mask = torch.arange(ctx)[None, :] <= torch.arange(ctx - (b - a), ctx)[:, None]
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[a:b] = o[0].transpose(0, 1).to(q.dtype)
    return out


class PagedAttentionTest(unittest.TestCase):
    def setUp(self):
        self.ops = ensure_compute_ops_loaded()

    def run_case(self, dtype, heads, kv_heads, head_dim, block_size, query_lens, context_lens, atol):
        g = torch.Generator().manual_seed(1)
        num_blocks = 64
        k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
        v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
        max_blocks = max(-(-c // block_size) for c in context_lens)
        # Each stream's blocks are scattered through the pool, as the block pool hands them out.
        perm = torch.randperm(num_blocks, generator=g)[: len(context_lens) * max_blocks]
        tables = perm.reshape(len(context_lens), max_blocks).to(torch.int32)
        starts = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0)), dtype=torch.int32)
        q = torch.randn(int(starts[-1]), heads, head_dim, generator=g).to(dtype)
        ctx = torch.tensor(context_lens, dtype=torch.int32)
        scale = head_dim ** -0.5
        ours = self.ops.paged_attention(q, k, v, tables, starts, ctx, scale)
        ref = reference_paged_attention(q, k, v, tables, starts, ctx, scale)
        torch.testing.assert_close(ours, ref, atol=atol, rtol=atol)

    def test_decode_prefill_and_chunk_after_prefix_fp32(self):
        # Streams: decode (1 query, 37 keys), full prefill (20 of 20), chunk after a prefix (5 of 50).
        self.run_case(torch.float32, 9, 3, 64, 16, [1, 20, 5], [37, 20, 50], 1e-5)

    def test_mqa_bf16(self):
        self.run_case(torch.bfloat16, 14, 2, 64, 16, [1, 1, 12], [100, 3, 12], 2e-2)

    def test_mha_small_blocks(self):
        self.run_case(torch.float32, 4, 4, 32, 4, [3, 1], [9, 64], 1e-5)
        self.run_case(torch.bfloat16, 4, 4, 32, 4, [3, 1], [9, 64], 2e-2)  # bf16 scores by `vdpbf16ps`

    def test_qwen3_shape_bf16_and_fp16_with_large_blocks(self):
        # head_dim 128, 8 query heads per KV head, 64-token blocks, a partial last block.
        for dtype in (torch.bfloat16, torch.float16):
            self.run_case(dtype, 16, 2, 128, 64, [1, 1, 30], [130, 64, 90], 2e-2)

    def test_items_of_kv_head_ranges_and_of_single_heads(self):
        # 5 tokens: each item takes 4 of the 6 KV heads (32 query heads at most), then the
        # other 2; 2 decode tokens: an item per KV head (fewer tokens than 2 x threads).
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            self.run_case(torch.bfloat16, 48, 6, 64, 16, [1, 4], [40, 20], 2e-2)
            self.run_case(torch.bfloat16, 48, 6, 64, 16, [1, 1], [40, 17], 2e-2)
        finally:
            torch.set_num_threads(threads)

    def test_sixteen_query_heads_per_kv_head_and_head_dim_32_in_large_blocks(self):
        # The largest group (an item of 2 KV heads, 32 query heads) and head_dim 32 with 32- and
        # 64-token blocks and odd key counts past 16: the bf16 values' pairs of keys across
        # several 16-key chunks of a block. Decode streams (prefetching) among prompt tokens.
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            self.run_case(torch.bfloat16, 32, 2, 128, 32, [1, 1, 9], [97, 33, 40], 2e-2)
            for block_size in (32, 64):
                self.run_case(torch.bfloat16, 8, 4, 32, block_size, [1, 1, 1, 5], [45, 19, 77, 39], 2e-2)
        finally:
            torch.set_num_threads(threads)

    def test_head_dim_without_a_vector_kernel(self):
        # 48 is not a specialized head dim: the portable kernel runs.
        self.run_case(torch.float32, 6, 2, 48, 16, [1, 7], [33, 7], 1e-5)

    def test_rejects_bad_shapes_with_a_clear_error(self):
        q = torch.zeros(2, 4, 8)
        cache = torch.zeros(4, 4, 4, 8)
        with self.assertRaisesRegex(RuntimeError, "query_starts"):
            self.ops.paged_attention(q, cache, cache, torch.zeros(1, 1, dtype=torch.int32),
                                     torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32), 1.0)


class FusedOpsTest(unittest.TestCase):
    def setUp(self):
        self.ops = ensure_compute_ops_loaded()
        self.g = torch.Generator().manual_seed(3)

    def test_fused_add_rms_norm_adds_in_place_then_normalizes(self):
        x, res, w = (torch.randn(5, 64, generator=self.g) for _ in range(3))
        w = w[0]
        expected_res = res + x
        out = self.ops.fused_add_rms_norm(x, res, w, 1e-6)
        torch.testing.assert_close(res, expected_res)
        torch.testing.assert_close(out, reference_rms_norm(expected_res, w, 1e-6))

    def test_silu_and_mul(self):
        x = torch.randn(7, 2 * 48, generator=self.g)
        gate, up = x.chunk(2, dim=-1)
        torch.testing.assert_close(self.ops.silu_and_mul(x), torch.nn.functional.silu(gate) * up)

    def test_silu_and_mul_rounds_like_hf_across_row_boundaries(self):
        # 50 x 203 elements: threads split rows mid-way and 203 leaves a masked tail; large
        # |gate| checks exp's range. HF: silu(gate) in the dtype, then times up.
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = (torch.randn(50, 2 * 203, generator=self.g) * 8).to(dtype)
            gate, up = x.chunk(2, dim=-1)
            torch.testing.assert_close(self.ops.silu_and_mul(x), torch.nn.functional.silu(gate) * up)

    def test_fused_add_rms_norm_bf16_rounds_the_sum(self):
        x, res = (torch.randn(9, 100, generator=self.g).to(torch.bfloat16) for _ in range(2))
        w = torch.randn(100, generator=self.g).to(torch.bfloat16)
        expected_res = res + x
        out = self.ops.fused_add_rms_norm(x, res, w, 1e-6)
        torch.testing.assert_close(res, expected_res, atol=0, rtol=0)
        torch.testing.assert_close(out, reference_rms_norm(expected_res, w, 1e-6))

    def test_rotary_matches_hf_rotate_half(self):
        from rtp_llm.device.base import _rotate

        q = torch.randn(6, 4, 32, generator=self.g)
        k = torch.randn(6, 2, 32, generator=self.g)
        pos = torch.tensor([0, 5, 9, 1, 2, 63])
        angles = torch.outer(torch.arange(64).float(), torch.rand(16, generator=self.g))
        cos, sin = angles.cos(), angles.sin()
        expected_q, expected_k = _rotate(q, cos[pos], sin[pos]), _rotate(k, cos[pos], sin[pos])
        self.ops.rotary_embedding(q, k, pos, cos, sin)
        torch.testing.assert_close(q, expected_q)
        torch.testing.assert_close(k, expected_k)

    def test_rotary_head_dims_with_a_ragged_half(self):
        from rtp_llm.device.base import _rotate

        for d in (20, 64, 160):  # halves 10, 32, 80: masked tails in the vector kernel
            q = torch.randn(3, 5, d, generator=self.g)
            k = torch.randn(3, 1, d, generator=self.g)
            pos = torch.tensor([4, 0, 7])
            angles = torch.outer(torch.arange(8).float(), torch.rand(d // 2, generator=self.g))
            cos, sin = angles.cos(), angles.sin()
            expected_q, expected_k = _rotate(q, cos[pos], sin[pos]), _rotate(k, cos[pos], sin[pos])
            self.ops.rotary_embedding(q, k, pos, cos, sin)
            torch.testing.assert_close(q, expected_q)
            torch.testing.assert_close(k, expected_k)
        with self.assertRaisesRegex(RuntimeError, "outside the rotary table"):
            self.ops.rotary_embedding(q, k, torch.tensor([0, 8, 1]), cos, sin)

    def check_qkv_rope_store(self, qkv, heads, kv_heads, pos, cos, sin, slots, cache_blocks, qn=None, kn=None):
        """qkv_rope_store on qkv equals the ops it fuses on a copy: the qkv it leaves (rotated in
        place) and the cache it writes, bit for bit. Returns its (q, k, v)."""
        T, D = qkv.shape[0], qkv.shape[1] // (heads + 2 * kv_heads)
        ref = qkv.clone()
        q = ref[:, :heads * D].reshape(T, heads, D)
        k = ref[:, heads * D:(heads + kv_heads) * D].reshape(T, kv_heads, D)
        v = ref[:, (heads + kv_heads) * D:].reshape(T, kv_heads, D)
        if qn is not None:
            q.copy_(self.ops.rms_norm(q.reshape(-1, D), qn, 1e-6).view_as(q))
            k.copy_(self.ops.rms_norm(k.reshape(-1, D), kn, 1e-6).view_as(k))
        self.ops.rotary_embedding(q, k, pos, cos, sin)
        ref_cache = torch.zeros(2, cache_blocks, 16, kv_heads, D, dtype=qkv.dtype)
        self.ops.store_kv(k, v, ref_cache, slots)
        cache = torch.zeros_like(ref_cache)
        fused = self.ops.qkv_rope_store(qkv, heads, kv_heads, pos, cos, sin, cache, slots, qn, kn, 1e-6)
        torch.testing.assert_close(qkv, ref, atol=0, rtol=0)
        torch.testing.assert_close(cache, ref_cache, atol=0, rtol=0)
        return fused

    def test_qkv_rope_store_equals_the_ops_it_fuses(self):
        H, Hkv, D, T = 6, 2, 64, 5
        angles = torch.outer(torch.arange(32).float(), torch.rand(D // 2, generator=self.g))
        cos, sin = angles.cos(), angles.sin()
        pos = torch.tensor([3, 0, 31, 7, 8])
        slots = torch.tensor([9, 2, 30, 17, 0])
        for dtype in (torch.float32, torch.bfloat16):
            for norms in (False, True):
                qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=self.g).to(dtype)
                qn = kn = None
                if norms:
                    qn, kn = (torch.randn(D, generator=self.g).to(dtype) for _ in range(2))
                fq, fk, fv = self.check_qkv_rope_store(qkv, H, Hkv, pos, cos, sin, slots, 2, qn, kn)
                self.assertEqual((fq.shape, fk.shape, fv.shape), ((T, H, D), (T, Hkv, D), (T, Hkv, D)))
                self.assertEqual(fq.data_ptr(), qkv.data_ptr())  # views: rotated in place
        cache = torch.zeros(2, 2, 16, Hkv, D, dtype=qkv.dtype)
        with self.assertRaisesRegex(RuntimeError, "num_heads \\+ 2 num_kv_heads"):
            self.ops.qkv_rope_store(qkv, H + 1, Hkv, pos, cos, sin, cache, slots)
        with self.assertRaisesRegex(RuntimeError, "slot 32 out of range"):
            self.ops.qkv_rope_store(qkv, H, Hkv, pos, cos, sin, cache, torch.tensor([0, 1, 32, 3, 4]))
        before = qkv.clone()
        with self.assertRaisesRegex(RuntimeError, r"must be \[64\] in qkv's dtype"):
            self.ops.qkv_rope_store(qkv, H, Hkv, pos, cos, sin, cache, slots, qn, torch.ones(D + 1, dtype=qkv.dtype))
        self.assertTrue(torch.equal(qkv, before))  # nothing written

    def test_qkv_rope_store_of_a_prompt_in_fp16(self):
        # More tokens than one thread's share (the tokens split over the threads).
        H, Hkv, D, T = 4, 2, 32, 150
        angles = torch.outer(torch.arange(T).float(), torch.rand(D // 2, generator=self.g))
        cos, sin = angles.cos(), angles.sin()
        pos, slots = torch.arange(T), torch.randperm(160, generator=self.g)[:T]
        qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=self.g).to(torch.float16)
        self.check_qkv_rope_store(qkv, H, Hkv, pos, cos, sin, slots, 10)

    def test_argmax_rows_is_torch_argmax(self):
        for v in (1, 15, 16, 17, 49152 + 5):
            x = torch.randn(5, v, generator=self.g)
            torch.testing.assert_close(self.ops.argmax_rows(x), x.argmax(-1))
        x = torch.zeros(4, 40)
        x[0, 7] = x[0, 33] = 2.0  # ties: the first
        x[1] = float("-inf")  # all -inf: 0
        x[2, 35] = float("nan")
        x[2, 36] = float("inf")  # a NaN wins, as in torch
        x[3, 21] = float("nan")
        x[3, 3] = float("nan")
        torch.testing.assert_close(self.ops.argmax_rows(x), torch.tensor([7, 0, 35, 3]))
        wide = torch.randn(3, 70, generator=self.g)
        torch.testing.assert_close(self.ops.argmax_rows(wide[:, 5:60]), wide[:, 5:60].argmax(-1))  # strided rows
        xb = torch.randn(3, 33, generator=self.g).to(torch.bfloat16)  # other dtypes: torch's
        torch.testing.assert_close(self.ops.argmax_rows(xb), xb.argmax(-1))
        nans = torch.full((2, 37), float("nan"))
        torch.testing.assert_close(self.ops.argmax_rows(nans), torch.tensor([0, 0]))
        cols = torch.randn(40, 3, generator=self.g).t()  # columns of unit stride only after a copy
        torch.testing.assert_close(self.ops.argmax_rows(cols), cols.argmax(-1))

    def test_token_bitmask_bans_exactly_the_unset_bits_of_its_rows(self):
        from rtp_llm.device.base import apply_token_bitmask as reference

        for vocab in (37, 4096 + 70):
            logits = torch.randn(5, vocab, generator=self.g)
            rows = torch.tensor([3, 0, 4, 3])  # row 3 twice: the union of both masks' bans
            bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (4, -(-vocab // 32)), generator=self.g,
                                 dtype=torch.int64).to(torch.int32)
            bits[1, 0], bits[2, 0] = -1, 0  # every bit of word 0 set (bit 31: the sign), then none
            want = logits.clone()
            for g in range(4):
                reference(want, rows[g:g + 1], bits[g:g + 1])
            got = logits.clone()
            self.ops.apply_token_bitmask(got, rows, bits)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            self.assertTrue(torch.equal(got[[1, 2]], logits[[1, 2]]))  # other rows as they were
        with self.assertRaisesRegex(RuntimeError, "out of range"):
            self.ops.apply_token_bitmask(got, torch.tensor([5]), bits[:1])
        with self.assertRaisesRegex(RuntimeError, "bits must be"):
            self.ops.apply_token_bitmask(got, rows[:1], bits[:1, :3])
        self.assertTrue(torch.equal(got[[1, 2]], logits[[1, 2]]))  # (nothing written by a refused call)

    def test_store_kv_writes_each_token_at_its_slot(self):
        cache = torch.zeros(2, 4, 4, 2, 8)
        k, v = torch.randn(3, 2, 8, generator=self.g), torch.randn(3, 2, 8, generator=self.g)
        slots = torch.tensor([13, 2, 7])
        self.ops.store_kv(k, v, cache, slots)
        flat = cache.view(2, 16, 2, 8)
        torch.testing.assert_close(flat[0, slots], k)
        torch.testing.assert_close(flat[1, slots], v)
        with self.assertRaisesRegex(RuntimeError, "out of range"):
            self.ops.store_kv(k, v, cache, torch.tensor([0, 1, 16]))


class CpuPeakTest(unittest.TestCase):
    def test_bf16_peak_is_measured_where_the_cpu_has_the_instruction(self):
        import platform

        flags = open("/proc/cpuinfo").read() if platform.system() == "Linux" else ""
        peak = ensure_compute_ops_loaded().cpu_bf16_peak_gflops()
        if " avx512_bf16" in flags and " avx512f" in flags:
            # Measured: a positive, finite rate. How high is the machine's business (a loaded CI
            # host measures less); a speed threshold here would be a timed assertion.
            self.assertTrue(0.0 < peak < float("inf"), peak)
        else:
            self.assertEqual(peak, 0.0)


class Bf16LinearTest(unittest.TestCase):
    def setUp(self):
        self.ops = ensure_compute_ops_loaded()
        self.gen = torch.Generator().manual_seed(3)
        if not self.ops.bf16_linear_supported():
            self.skipTest("no AVX512-BF16 on this CPU")

    def _case(self, m, n, k):
        x = torch.randn(m, k, generator=self.gen).to(torch.bfloat16)
        w = (torch.randn(n, k, generator=self.gen) / k ** 0.5).to(torch.bfloat16)
        return x, w, (x.float() @ w.float().t()).to(torch.bfloat16)

    def test_matches_the_fp32_product_rounded_to_bf16(self):
        # Decode batches (<= 16 rows): every row count, one decode tile each, with the rows'
        # pairs of k interleaved 16 at a time (K = 70: two groups and 3 pairs left over).
        # Prefill-sized ones on 4-row x 4-block tiles with the blocks and rows left over,
        # across a 256-row panel; 512 columns: 32 blocks, split over the threads.
        cases = [(m, 48, 70) for m in range(1, 17)] + [(1, 48, 2), (3, 64, 30), (12, 512, 64), (17, 64, 30),
                                                      (31, 112, 128), (70, 512, 32), (300, 80, 40)]
        for m, n, k in cases:
            x, w, want = self._case(m, n, k)
            got = self.ops.bf16_linear(x, self.ops.pack_bf16_linear(w))
            # Exact products, fp32 sums in another order than the reference's: one bf16 unit.
            torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-2, msg=f"{m}x{n}x{k}")

    def test_strided_rows_and_a_given_output(self):
        for m in (1, 4, 16, 20):  # rows starting at odd elements (2-byte aligned pairs of k), K = 70
            x, w, want = self._case(m, 32, 70)
            wide = torch.zeros(m, 80, dtype=torch.bfloat16)
            wide[:, 7:77] = x
            out = torch.full((m, 40), 7.0, dtype=torch.bfloat16)
            got = self.ops.bf16_linear(wide[:, 7:77], self.ops.pack_bf16_linear(w), out=out[:, 4:36])
            torch.testing.assert_close(out[:, 4:36], want, rtol=2 ** -7, atol=1e-2)
            self.assertEqual(got.data_ptr(), out[:, 4:36].data_ptr())
            self.assertTrue(torch.equal(out[:, :4], torch.full((m, 4), 7.0, dtype=torch.bfloat16)))

    def test_gate_up_with_silu_in_the_epilogue_equals_linear_then_silu_and_mul(self):
        # Every decode row count; prefill tiles with an output block of 4-block groups left
        # over (I = 80: 10 blocks) and a panel boundary; K with a tail of pairs.
        for inter, k in ((80, 70), (64, 576), (16, 2)):
            w = (torch.randn(2 * inter, k, generator=self.gen) * 0.3).to(torch.bfloat16)
            plain, gated = self.ops.pack_bf16_linear(w), self.ops.pack_bf16_gate_up(w)
            for m in list(range(1, 18)) + [20, 300]:
                x = (torch.randn(m, k, generator=self.gen) * 2).to(torch.bfloat16)
                want = self.ops.silu_and_mul(self.ops.bf16_linear(x, plain))
                torch.testing.assert_close(self.ops.bf16_linear_silu(x, gated), want, atol=0, rtol=0,
                                           msg=f"I={inter} K={k} M={m}")
        with self.assertRaisesRegex(RuntimeError, r"I % 16 == 0"):
            self.ops.pack_bf16_gate_up(torch.zeros(48, 8, dtype=torch.bfloat16))
        x = torch.zeros(2, 8, dtype=torch.bfloat16)
        with self.assertRaisesRegex(RuntimeError, r"must come from pack_bf16_gate_up"):  # N % 32 == 0, plain
            self.ops.bf16_linear_silu(x, self.ops.pack_bf16_linear(torch.zeros(64, 8, dtype=torch.bfloat16)))
        with self.assertRaisesRegex(RuntimeError, r"must come from pack_bf16_linear"):
            self.ops.bf16_linear(x, self.ops.pack_bf16_gate_up(torch.zeros(64, 8, dtype=torch.bfloat16)))

    def test_rejects_unpackable_and_mismatched_shapes_with_clear_errors(self):
        with self.assertRaisesRegex(RuntimeError, r"N % 16 == 0"):
            self.ops.pack_bf16_linear(torch.zeros(24, 8, dtype=torch.bfloat16))
        with self.assertRaisesRegex(RuntimeError, r"an even K"):
            self.ops.pack_bf16_linear(torch.zeros(16, 7, dtype=torch.bfloat16))
        packed = self.ops.pack_bf16_linear(torch.zeros(16, 8, dtype=torch.bfloat16))
        with self.assertRaisesRegex(RuntimeError, r"x has K = 6, the weight 8"):
            self.ops.bf16_linear(torch.zeros(2, 6, dtype=torch.bfloat16), packed)
        with self.assertRaisesRegex(RuntimeError, r"the weight must come from pack_bf16_linear"):
            self.ops.bf16_linear(torch.zeros(2, 8, dtype=torch.bfloat16), torch.zeros(16, 8, dtype=torch.bfloat16))
        with self.assertRaisesRegex(RuntimeError, r"out must be a bf16 \[2, 16\]"):
            self.ops.bf16_linear(torch.zeros(2, 8, dtype=torch.bfloat16), packed,
                                 out=torch.zeros(2, 8, dtype=torch.bfloat16))
        x = torch.zeros(2, 16, dtype=torch.bfloat16)
        square = self.ops.pack_bf16_linear(torch.zeros(16, 16, dtype=torch.bfloat16))
        with self.assertRaisesRegex(RuntimeError, r"refer to a single memory location"):
            self.ops.bf16_linear(x, square, out=x)  # out would overwrite x while it is read


if __name__ == "__main__":
    unittest.main()
