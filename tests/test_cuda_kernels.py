"""The CUDA backend's Triton kernels against plain torch references. On a machine without a
GPU they run in Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported),
so the kernels' indexing and masking are checked in CI too; on a GPU they run natively."""

import pytest
import torch
from interpreted_triton import (DEV, DTYPES, INTERPRETED, InterpretedCudaBackend, interpreted_cuda_llm,
                                skip_interpreted_bf16_dot)

from rtp_llm.device.base import _rotate
from rtp_llm.device.cuda import kernels as K


def _elementwise_tol(dtype):
    """Elementwise kernels round like HF; transcendental functions and the order of a row's sum
    may differ by a unit in the last place. The interpreter casts to bf16 by truncation, so
    there bf16 results may be one more unit off."""
    if dtype == torch.float32:
        return dict(rtol=1e-6, atol=1e-6)
    return dict(rtol=2 ** -6 if INTERPRETED else 2 ** -7, atol=1e-5)


def _hf_rms_norm(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_fused_residual_add_match_hf_rounding(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 96, generator=g).to(dtype).to(DEV)
    r = torch.randn(5, 96, generator=g).to(dtype).to(DEV)
    w = torch.randn(96, generator=g).to(dtype).to(DEV)
    tol = _elementwise_tol(dtype)
    torch.testing.assert_close(K.rms_norm(x, w, 1e-6), _hf_rms_norm(x, w, 1e-6), **tol)
    res = r.clone()
    out = K.rms_norm(x, w, 1e-6, residual=res)
    torch.testing.assert_close(res, r + x, **(tol if INTERPRETED else dict(rtol=0, atol=0)))
    torch.testing.assert_close(out, _hf_rms_norm(res, w, 1e-6), **tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place_on_strided_views_matches_hf(dtype):
    t, h, hkv, d = 6, 4, 2, 32
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=g).to(dtype).to(DEV)
    q = qkv[:, : h * d].view(t, h, d)
    k = qkv[:, h * d:(h + hkv) * d].view(t, hkv, d)
    pos = torch.tensor([0, 5, 1, 17, 3, 2], device=DEV)
    ang = torch.outer(torch.arange(32).float(), 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d))
    cos, sin = ang.cos().to(DEV), ang.sin().to(DEV)
    want_q, want_k = _rotate(q.clone(), cos[pos], sin[pos]), _rotate(k.clone(), cos[pos], sin[pos])
    v_before = qkv[:, (h + hkv) * d:].clone()
    K.rotary(q, k, pos, cos, sin)
    # A difference of two rounded products can cancel: compare against the inputs' scale.
    tol = dict(rtol=0, atol=1e-6 if dtype == torch.float32 else 2 ** -5)
    torch.testing.assert_close(q, want_q, **tol)
    torch.testing.assert_close(k, want_k, **tol)
    assert torch.equal(qkv[:, (h + hkv) * d:], v_before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    x = torch.randn(3, 2 * 80, generator=torch.Generator().manual_seed(2)).to(dtype).to(DEV)
    gate, up = x[:, :80], x[:, 80:]
    torch.testing.assert_close(K.silu_and_mul(x), torch.nn.functional.silu(gate) * up,
                               **_elementwise_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n,k", [(1, 37, 300), (2, 16, 128), (3, 9, 200), (4, 20, 70)])
def test_gemv_equals_the_matmul(dtype, rows, n, k):
    # Ragged N and K: masked tiles.
    g = torch.Generator().manual_seed(4)
    w = torch.randn(n, k, generator=g).to(dtype).to(DEV)
    x = torch.randn(rows, k, generator=g).to(dtype).to(DEV)
    expected = (x.float() @ w.float().t()).to(dtype)
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=2e-2)
    for config in [(4, 64, 4), (1, 128, 4), K.gemv_config(n, k)]:
        torch.testing.assert_close(K.gemv(x, w, config), expected, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,i,k", [(1, 37, 300), (2, 16, 128), (4, 20, 70)])
def test_gated_gemv_equals_silu_and_mul_of_the_matmul(dtype, rows, i, k):
    # gate_up [2 I, K]: SiLU-and-mul in the GEMV's epilogue rounds as the two kernels do.
    g = torch.Generator().manual_seed(6)
    w = torch.randn(2 * i, k, generator=g).to(dtype).to(DEV)
    x = torch.randn(rows, k, generator=g).to(dtype).to(DEV)
    expected = K.silu_and_mul((x.float() @ w.float().t()).to(dtype))
    # bf16: three roundings (gate, act, product); a gate one unit off from another summation
    # order ends up to ~3 units off.
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=2 ** -5, atol=2e-2)
    for config in [(4, 64, 4), (1, 128, 4), K.gemv_config(2 * i, k, gated=True)]:
        torch.testing.assert_close(K.gemv(x, w, config, gated=True), expected, **tol)


@pytest.mark.parametrize("n,k,gated", [(1056, 2560, False), (640, 2560, False), (1088, 1280, True),
                                       (64, 3000, True)])
def test_gemv_default_configs_compile_for_any_k(n, k, gated):
    # Triton tiles must be powers of two, whatever K (e.g. Qwen3-4B's 2560) gives.
    bn, bk, _ = K.gemv_config(n, k, gated)
    assert bn & (bn - 1) == 0 and bk & (bk - 1) == 0 and (not gated or bn >= 2)
    g = torch.Generator().manual_seed(8)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(torch.bfloat16).to(DEV)
    x = torch.randn(1, k, generator=g).to(torch.bfloat16).to(DEV)
    y = (x.float() @ w.float().t()).to(torch.bfloat16)
    expected = K.silu_and_mul(y) if gated else y
    torch.testing.assert_close(K.gemv(x, w, gated=gated), expected, rtol=2 ** -5, atol=2e-2)


def test_gemv_writes_into_the_given_buffer():
    # The row-parallel projections write their partial sums into the all-reduce's buffer.
    g = torch.Generator().manual_seed(7)
    w = torch.randn(24, 64, generator=g).to(DEV)
    x = torch.randn(2, 64, generator=g).to(DEV)
    buf = torch.full((100,), 7.0, device=DEV)
    out = K.gemv(x, w, out=buf[:48].view(2, 24))
    assert out.data_ptr() == buf.data_ptr()
    torch.testing.assert_close(out, x @ w.t(), rtol=1e-5, atol=1e-4)
    assert torch.equal(buf[48:], torch.full((52,), 7.0, device=DEV))


def test_use_gemv_picks_it_for_decode_rows_of_half_precision_weights():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(64, 48, generator=g).to(torch.bfloat16)
    x1, x8 = torch.randn(1, 48, generator=g).to(torch.bfloat16), torch.randn(8, 48).to(torch.bfloat16)
    assert K.use_gemv(x1, w)
    assert not K.use_gemv(x8, w)  # 8 rows: cuBLAS
    assert K.use_gemv(torch.randn(2, 48).to(torch.bfloat16), w)  # 2 rows, N <= 1024
    assert not K.use_gemv(torch.randn(2, 48).to(torch.bfloat16), torch.randn(2048, 48).to(torch.bfloat16))
    assert not K.use_gemv(x1.float(), w.float())  # fp32: cuBLAS, HF's sums
    assert not K.use_gemv(x1, w.t().contiguous().t())  # gemv wants [N, K] contiguous


def _paged_case(dtype, ctx_lens, q_lens, hkv=2, group=3, d=32, page=16, seed=3):
    """A KV cache with the streams' tokens at scattered pages, and per-stream reference K/V."""
    g = torch.Generator().manual_seed(seed)
    n_pages = sum(-(-c // page) for c in ctx_lens) + 3
    kv = torch.zeros(2, n_pages, page, hkv, d, dtype=dtype)
    perm = torch.randperm(n_pages, generator=g).tolist()
    max_pages = max(-(-c // page) for c in ctx_lens)
    tables = torch.zeros(len(ctx_lens), max_pages, dtype=torch.int32)
    ks, vs = [], []
    for s, c in enumerate(ctx_lens):
        pages = [perm.pop() for _ in range(-(-c // page))]
        tables[s, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        k = torch.randn(c, hkv, d, generator=g).to(dtype)
        v = torch.randn(c, hkv, d, generator=g).to(dtype)
        for p in range(c):
            kv[0, pages[p // page], p % page] = k[p]
            kv[1, pages[p // page], p % page] = v[p]
        ks.append(k)
        vs.append(v)
    q = torch.randn(sum(q_lens), hkv * group, d, generator=g).to(dtype)
    starts = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    return kv, tables, starts, torch.tensor(ctx_lens, dtype=torch.int32), q, ks, vs


def _reference(q, ks, vs, starts, ctx_lens, scale):
    out = torch.zeros_like(q, dtype=torch.float32)
    for s in range(len(ks)):
        a, b = int(starts[s]), int(starts[s + 1])
        n, c = b - a, int(ctx_lens[s])
        group = q.shape[1] // ks[s].shape[1]
        k = ks[s].float().repeat_interleave(group, dim=1)  # [c, H, D]
        v = vs[s].float().repeat_interleave(group, dim=1)
        att = torch.einsum("nhd,chd->hnc", q[a:b].float(), k) * scale
        mask = torch.arange(c)[None, :] > torch.arange(c - n, c)[:, None]
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        out[a:b] = torch.einsum("hnc,chd->nhd", att, v)
    return out


def _tol(dtype):
    return dict(rtol=0, atol=2e-5) if dtype == torch.float32 else dict(rtol=0, atol=3e-2)


def _fp8(kv, ks, vs):
    """The case's cache as an FP8 (e4m3) cache and the reference keys / values it holds."""
    e4m3 = torch.float8_e4m3fn
    return kv.to(e4m3), [k.to(e4m3).to(k.dtype) for k in ks], [v.to(e4m3).to(v.dtype) for v in vs]


@pytest.mark.parametrize("fp8_kv", [False, True], ids=["kv", "fp8-kv"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_extend_attention_prefill_chunk_after_prefix_and_decode_rows(dtype, fp8_kv):
    # stream 0: whole 40-token prompt; 1: a 20-token chunk after a 50-token cached prefix;
    # 2: one decode token at position 70; 3: a prompt of 1 token.
    skip_interpreted_bf16_dot(dtype)
    ctx, qn = [40, 70, 71, 1], [40, 20, 1, 1]
    assert K.EXTEND_BLOCK_M >= 40
    kv, tables, starts, ctx_t, q, ks, vs = _paged_case(dtype, ctx, qn)
    if fp8_kv:
        kv, ks, vs = _fp8(kv, ks, vs)
    out = torch.zeros_like(q).to(DEV)
    tiles = torch.from_numpy(K.extend_tiles(torch.tensor(qn).numpy())).to(DEV)
    assert tiles.shape[1] == 4  # one per stream: no query run is longer than a tile here
    # a padding tile (stream -1), as captured graphs have, must be a no-op
    tiles = torch.cat([tiles, torch.tensor([[-1], [0]], dtype=torch.int32, device=DEV)], dim=1)
    K.extend_attention(q.to(DEV), kv.to(DEV), tables.to(DEV), starts.to(DEV), ctx_t.to(DEV), tiles, 0.2, out)
    want = _reference(q, ks, vs, starts, ctx_t, 0.2)
    torch.testing.assert_close(out.float().cpu(), want, **_tol(dtype))


@pytest.mark.parametrize("fp8_kv", [False, True], ids=["kv", "fp8-kv"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits,longest", [(1, 130), (4, 130), (64, 2100)])
def test_split_decode_attention_with_a_padding_stream(dtype, splits, longest, fp8_kv):
    # 64 splits over 2100 keys: 33 non-empty splits, merged in two tiles of 32.
    skip_interpreted_bf16_dot(dtype)
    ctx = [1, 37, longest]
    kv, tables, starts, ctx_t, q, ks, vs = _paged_case(dtype, ctx, [1, 1, 1], group=4)
    if fp8_kv:
        kv, ks, vs = _fp8(kv, ks, vs)
    # a fourth, padding stream (context 0), as a captured graph has: its output must be zeros
    tables = torch.cat([tables, torch.zeros(1, tables.shape[1], dtype=torch.int32)])
    q = torch.cat([q, torch.randn(1, *q.shape[1:]).to(dtype)])
    starts = torch.arange(5, dtype=torch.int32)
    ctx_t = torch.tensor(ctx + [0], dtype=torch.int32)
    ws = K.DecodeWorkspace(4, q.shape[1], q.shape[2], splits, DEV)
    want = _reference(q[:3], ks, vs, starts[:4], ctx_t[:3], 0.2)
    # Twice on one workspace: the last split of each (stream, KV head) merges, and must leave
    # its counter at 0 for the next launch (a graph replays with the same counters).
    for _ in range(2):
        out = torch.full_like(q, 7.0).to(DEV)
        K.decode_attention(q.to(DEV), kv.to(DEV), tables.to(DEV), starts.to(DEV), ctx_t.to(DEV), 0.2, splits, ws,
                           out)
        torch.testing.assert_close(out[:3].float().cpu(), want, **_tol(dtype))
        assert torch.equal(out[3].cpu(), torch.zeros_like(out[3].cpu()))
        assert not ws.counters.any()


@pytest.mark.parametrize("cache", [None, torch.float8_e4m3fn], ids=["kv", "fp8-kv"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_writes_slots_and_skips_negative_ones(dtype, cache):
    if cache is not None and INTERPRETED:
        pytest.skip("the interpreter's e4m3 rounding is off (test_cuda_fp8.py); the GPU checks the FP8 store")
    t, hkv, d, page = 4, 2, 32, 16
    qkv = (torch.randn(t, 3 * hkv * d) * 100).to(dtype).to(DEV)  # some values past e4m3's 448: saturated
    k = qkv[:, : hkv * d].view(t, hkv, d)
    v = qkv[:, hkv * d: 2 * hkv * d].view(t, hkv, d)
    kv = torch.zeros(2, 3, page, hkv, d, dtype=cache or dtype, device=DEV)
    slots = torch.tensor([17, 0, -1, 47], device=DEV)
    K.store_kv(k, v, kv, slots)
    flat = kv.view(2, -1, hkv, d)
    stored = (lambda x: x) if cache is None else (lambda x: x.float().clamp(-448, 448).to(cache))
    for i, s in enumerate([17, 0, None, 47]):
        if s is not None:
            assert torch.equal(flat[0, s].float(), stored(k[i]).float())
            assert torch.equal(flat[1, s].float(), stored(v[i]).float())
    assert int((flat.float().abs().sum(dim=(2, 3)) > 0).sum()) == 6


@pytest.mark.parametrize("vocab", [37, 4096 + 70])
def test_token_bitmask_bans_exactly_the_unset_bits_of_its_rows(vocab):
    from rtp_llm.device.base import apply_token_bitmask as reference

    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=g)
    rows = torch.tensor([3, 0, 4], dtype=torch.int64)
    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (3, -(-vocab // 32)), generator=g, dtype=torch.int64).to(torch.int32)
    bits[1, 0] = -1  # bit 31 (the sign) and every other bit of word 0 set
    want = logits.clone()
    reference(want, rows, bits)
    got = logits.to(DEV)
    K.apply_token_bitmask(got, rows.to(DEV), bits.to(DEV))
    assert torch.equal(got.cpu(), want)
    assert torch.isinf(want[rows]).any() and torch.equal(got.cpu()[[1, 2]], logits[[1, 2]])  # other rows as they were


def test_extend_tiles_cover_every_query_row_once():
    import numpy as np

    m = K.EXTEND_BLOCK_M
    q_lens = np.array([1, m, m + 1, 3 * m - 2, 2], dtype=np.int32)
    out = np.full((2, 12), 99, dtype=np.int32)
    K.extend_tiles(q_lens, out=out)
    covered = {}
    for s, start in zip(*out):
        if s < 0:
            continue
        for r in range(start, min(start + m, q_lens[s])):
            covered[(s, r)] = covered.get((s, r), 0) + 1
    assert covered == {(s, r): 1 for s in range(len(q_lens)) for r in range(q_lens[s])}
    assert (out[0, 8:] == -1).all()  # 1 + 1 + 2 + 3 + 1 tiles, the rest padding


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [True, False])
def test_fused_qkv_to_cache_equals_the_composed_ops(dtype, qk_norm):
    from rtp_llm.device.base import DeviceBackend

    t, h, hkv, d, page = 5, 4, 2, 32, 16
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=g).to(dtype).to(DEV)
    qw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype).to(DEV) if qk_norm else None
    kw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype).to(DEV) if qk_norm else None
    pos = torch.tensor([3, 0, 9, 4, 1], device=DEV)
    ang = torch.outer(torch.arange(16).float(), 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d))
    cos, sin = ang.cos().to(DEV), ang.sin().to(DEV)
    slots = torch.tensor([5, 17, -1, 40, 2], device=DEV)

    class Composed(DeviceBackend):  # the interface's default composition over the same kernels
        allocate_kv_cache = available_memory_bytes = prepare_attention = attention = None

        def rms_norm(self, x, w, eps):
            return K.rms_norm(x, w, eps)

        def silu_and_mul(self, x):
            return K.silu_and_mul(x)

        def write_kv(self, k, v, kv, meta):
            K.store_kv(k, v, kv, slots)

        def rotary(self, q, k, positions, cos, sin):
            K.rotary(q, k, positions, cos, sin)
            return q, k

    want_kv = torch.zeros(2, 4, page, hkv, d, dtype=dtype, device=DEV)
    ref = qkv.clone()
    q_ref, k_ref, _ = Composed.qkv_to_cache(Composed.__new__(Composed), ref, h, hkv, d, qw, kw, 1e-6, pos, cos,
                                            sin, want_kv, None)
    kv = torch.zeros_like(want_kv)
    K.qkv_to_cache(qkv, h, hkv, d, qw, kw, 1e-6, pos, cos, sin, kv, slots)
    tol = _elementwise_tol(dtype) if qk_norm else dict(rtol=0, atol=1e-6 if dtype == torch.float32 else 2 ** -5)
    torch.testing.assert_close(qkv[:, : h * d].view(t, h, d), q_ref, **tol)
    torch.testing.assert_close(qkv[:, h * d:(h + hkv) * d].view(t, hkv, d), k_ref, **tol)
    torch.testing.assert_close(kv, want_kv, **tol)


@pytest.mark.skipif(not INTERPRETED, reason="on a GPU, tests/test_cuda.py runs the real backend")
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-inputs"])
@pytest.mark.parametrize("name", ["llama_mha_untied", "qwen3_gqa_untied"])
def test_cuda_backend_greedy_equals_hf_with_chunked_prefill(tmp_path, monkeypatch, name, graphs):
    from testlib import hf_greedy, hf_model, make_tiny, random_prompts


    path = make_tiny(name, str(tmp_path))
    hf = hf_model(path)
    backend = InterpretedCudaBackend.make(graphs)
    split_steps = []  # attention calls with decode rows beside extend tiles
    attention = backend.attention
    backend.attention = lambda q, k, v, kv, meta, scale: (
        split_steps.append(meta.decode_rows is not None), attention(q, k, v, kv, meta, scale))[1]
    llm = interpreted_cuda_llm(path, monkeypatch, backend)
    # (50, 7): chunks of one prompt, then both; (7, 50, 30): the first decodes beside the
    # others' chunks (mixed steps: eager, their one-token streams take the decode kernel).
    for lens in [(50, 7), (7, 50, 30)]:
        prompts = random_prompts(len(lens), lens)
        outs = llm.generate(prompts, {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
        for prompt, out in zip(prompts, outs):
            assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 8), (name, len(prompt))
    # Eager mixed steps split; a captured extend graph keeps its few decode rows in its tiles.
    assert any(split_steps) == (not graphs)
    llm.close()


@pytest.mark.skipif(not INTERPRETED, reason="on a GPU, tests/test_cuda_speculative.py runs the real backend")
def test_verify_steps_replay_graphs_though_they_sample_more_rows_than_streams(tmp_path, monkeypatch):
    # A verify step samples 1 + d rows per stream: one stream drafting 4 tokens samples 5 rows, more
    # than the 4 streams of the runner. Its extend graph must take them all (an eager verify step
    # costs its launches at batch 1, more than its compute), and the tokens stay HF's. The target
    # drafts for itself: every draft is accepted, so rounds draft 4.
    from testlib import hf_greedy, hf_model, make_loopy, repetitive_prompts

    from rtp_llm.config.speculative import SpeculativeConfig

    path = make_loopy(str(tmp_path))
    hf = hf_model(path)
    llm = interpreted_cuda_llm(path, monkeypatch, InterpretedCudaBackend.make(True),
                               speculative=SpeculativeConfig("vanilla", 4, sp_checkpoint_path=path))
    graphs, verify = llm.engine.runner.graphs, []  # per verify step: (its tokens, replayed)
    stage = graphs.stage

    def recording(b):
        replay = stage(b)
        if b.num_draft_tokens:
            verify.append((len(b.token_ids), replay is not None))
        return replay
    graphs.stage = recording
    try:
        prompt = repetitive_prompts()[0]
        out = llm.generate([prompt], {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True})[0]
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 12)
    finally:
        llm.close()
    assert verify and max(t for t, _ in verify) > 4, verify  # (some step verified more rows than streams)
    assert all(replayed for _, replayed in verify), verify


@pytest.mark.skipif(not INTERPRETED, reason="on a GPU, tests/test_cuda_speculative.py runs the real backend")
def test_eagle3_drafts_on_the_device_reach_the_replayed_verify_step(tmp_path, monkeypatch):
    # An EAGLE-3 head's drafts stay on the device (draft_model.DeviceDrafts): the verify step's
    # graph inputs take them on the device, and commit compares them with the samples; the head's
    # draft steps replay as chains (streams drafting fewer than others among them). The greedy
    # text is HF's and every proposal is the plain-torch head's, with drafts forced through or not.
    import functools

    from eagle3_ref import EAGLE_TARGET, assert_head_drafts, reference_drafts, write_eagle3_head
    from testlib import hf_greedy, hf_model, make_tiny, random_prompts

    from rtp_llm.async_decoder_engine.draft_model import FORCE_ACCEPT_ENV
    from rtp_llm.config.speculative import SpeculativeConfig

    target = make_tiny("qwen3_4layers", str(tmp_path), spec=EAGLE_TARGET)
    head = write_eagle3_head(str(tmp_path / "head"), target, seed=1, draft_vocab=200)
    reference = functools.partial(reference_drafts, target, head)
    hf = hf_model(target)
    chains = []  # (chain length, streams, some stream drafting fewer, replayed) per run of the head's graphs
    for forced in (False, True):
        if forced:
            monkeypatch.setenv(FORCE_ACCEPT_ENV, "0.6")
        llm = interpreted_cuda_llm(target, monkeypatch, InterpretedCudaBackend.make(True),
                                   speculative=SpeculativeConfig("eagle3", 3, sp_checkpoint_path=head))
        graphs = llm.engine.runner.drafter.graphs
        run = graphs.run

        def recording(tokens, hidden, positions, slots, block_tables):
            out = run(tokens, hidden, positions, slots, block_tables)
            chains.append((*slots.shape, bool((slots < 0).any()), out is not None))
            return out
        graphs.run = recording
        assert_head_drafts(llm, reference, random_prompts(5, [5, 6, 21]), 10,
                           None if forced else (lambda prompt: hf_greedy(hf, prompt, 10)))
    # the draft steps ran as replayed chains (head_graphs.py), streams drafting fewer among them
    assert chains and all(replayed for *_, replayed in chains), chains
    assert any(length == 2 and fewer for length, _, fewer, _ in chains), chains


@pytest.mark.skipif(not INTERPRETED, reason="on a GPU, tests/test_cuda.py runs the real backend")
def test_cuda_backend_prompt_logprobs_equal_hf_in_chunks(tmp_path, monkeypatch):
    # Prompt log-probs (echo with logprobs) through the CUDA step path: their steps run eagerly
    # though graphs are on (no graph computes the prompt rows), in chunks of 16.
    from testlib import hf_logprobs, hf_model, make_tiny, random_prompts

    from rtp_llm.config.generate_config import GenerateConfig
    from rtp_llm.ops.engine_core import decode_output

    path = make_tiny("qwen3_gqa_untied", str(tmp_path))
    hf = hf_model(path)
    llm = interpreted_cuda_llm(path, monkeypatch, InterpretedCudaBackend.make(True))
    try:
        prompts = random_prompts(3, (40, 9))
        config = GenerateConfig(max_new_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=2).to_proto()
        ids = [llm.engine.core.enqueue(p, config) for p in prompts]
        while llm.engine.step():
            pass
        for prompt, sid in zip(prompts, ids):
            out = decode_output(llm.engine.core.poll(sid)[0])
            ref = hf_logprobs(hf, prompt)[:-1]
            want = ref.gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1)
            torch.testing.assert_close(torch.tensor(out.prompt_logprobs), want, atol=1e-4, rtol=1e-4)
            assert [[t for t, _ in row] for row in out.prompt_top_logprobs] == ref.topk(2, dim=-1).indices.tolist()
    finally:
        llm.close()
