"""The CUDA backend's latent attention (kernels/mla.py) against a dense torch reference, and
DeepSeek-V2/V3 models through the CUDA step path. Without a GPU through Triton's interpreter."""

import numpy as np
import pytest
import torch
from interpreted_triton import DEV, DTYPES, INTERPRETED, assert_greedy_equals_hf, skip_interpreted_bf16_dot

from rtp_llm.device.cuda import graph_runner
from rtp_llm.device.cuda import kernels as K
from rtp_llm.device.cuda.kernels import mla as mla_kernels


def _reference(q_nope, q_pe, cache, block_tables, query_starts, context_lens, w_uk, w_uv, scale):
    """Row by row in fp32: the row's context (its position + 1 tokens) gathered from the pages,
    scored as latent . (q_nope w_uk) + k_pe . q_pe, averaged over the latents, then w_uv."""
    T, H, _ = q_nope.shape
    kvr = w_uk.shape[2]
    page = cache.shape[1]
    flat = cache.view(-1, cache.shape[-1]).float()
    out = torch.zeros(T, H, w_uv.shape[2])
    qs, ctx = query_starts.tolist(), context_lens.tolist()
    for s in range(len(ctx)):
        for t in range(qs[s], qs[s + 1]):
            n = ctx[s] - (qs[s + 1] - t) + 1
            j = torch.arange(n)
            rows = flat[block_tables[s, j // page].long() * page + j % page]                  # [n, W]
            q = torch.cat([torch.einsum("hd,hdc->hc", q_nope[t].float(), w_uk.float()), q_pe[t].float()], -1)
            p = torch.softmax(q @ rows.t() * scale, dim=-1)                                    # [H, n]
            out[t] = torch.einsum("hc,hcv->hv", p @ rows[:, :kvr], w_uv.float())
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kvr,dr,heads", [(32, 8, 4), (64, 16, 20), (288, 16, 40)])  # (the last: two head blocks)
def test_latent_attention_equals_the_reference_over_pages(dtype, kvr, dr, heads):
    # One stream's chunk of 5 rows after 7 cached tokens, one decode row at context 40 (pages out
    # of order, a context over two BLOCK_N tiles), a padding row past every stream.
    skip_interpreted_bf16_dot(dtype)
    g = torch.Generator().manual_seed(3)
    page, blocks, dn, dv = 16, 12, 24, 20
    cache = torch.randn(blocks, page, kvr + dr, generator=g).to(dtype).to(DEV)
    block_tables = torch.tensor([[5, 2, 0], [7, 1, 9]], dtype=torch.int32, device=DEV)
    query_starts = torch.tensor([0, 5, 6], dtype=torch.int32, device=DEV)
    context_lens = torch.tensor([12, 40], dtype=torch.int32, device=DEV)
    T = 7
    q_nope = torch.randn(T, heads, dn, generator=g).to(dtype).to(DEV)
    q_pe = torch.randn(T, heads, dr, generator=g).to(dtype).to(DEV)
    w_uk = (torch.randn(heads, dn, kvr, generator=g) / dn ** 0.5).to(dtype).to(DEV)
    w_uv = (torch.randn(heads, kvr, dv, generator=g) / kvr ** 0.5).to(dtype).to(DEV)
    scale = (dn + dr) ** -0.5
    out = K.mla_attention(q_nope, q_pe, cache, block_tables, query_starts, context_lens, w_uk, w_uv, scale)
    expected = _reference(q_nope.cpu(), q_pe.cpu(), cache.cpu(), block_tables.cpu(), query_starts.cpu(),
                          context_lens.cpu(), w_uk.cpu(), w_uv.cpu(), scale)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(out[:6].float().cpu(), expected[:6], **tol)
    assert torch.all(out[6] == 0)  # the padding row


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kvr,dr,heads", [(32, 8, 3), (64, 16, 5)])
def test_expanded_prompt_rows_and_absorbed_decode_rows_equal_the_reference(dtype, kvr, dr, heads):
    # A mixed step as an eager MLA step runs it: stream 0 a chunk of 5 rows after 7 cached
    # tokens, stream 1 one decode row (the absorbed kernel over that row alone), stream 2 a
    # fresh prompt of 70 rows (two query tiles, keys over two BLOCK_N tiles); pages out of order.
    skip_interpreted_bf16_dot(dtype)
    g = torch.Generator().manual_seed(5)
    page, blocks, dn, dv = 16, 16, 24, 20
    cache = torch.randn(blocks, page, kvr + dr, generator=g).to(dtype).to(DEV)
    tables = np.array([[5, 2, 0, 0, 0], [7, 1, 9, 0, 0], [3, 11, 4, 15, 12]], dtype=np.int32)
    qlens, ctx = np.array([5, 1, 70]), np.array([12, 40, 70], dtype=np.int32)
    query_starts = torch.tensor(np.concatenate([[0], np.cumsum(qlens)]), dtype=torch.int32, device=DEV)
    T = int(qlens.sum())
    q_nope = torch.randn(T, heads, dn, generator=g).to(dtype).to(DEV)
    q_pe = torch.randn(T, heads, dr, generator=g).to(dtype).to(DEV)
    kv_b_proj = torch.randn(heads * (dn + dv), kvr, generator=g) / kvr ** 0.5     # as published
    per_head = kv_b_proj.view(heads, dn + dv, kvr)
    w_uk, w_uv = per_head[:, :dn].contiguous(), per_head[:, dn:].transpose(1, 2).contiguous()
    scale = (dn + dr) ** -0.5
    prompt = qlens > 1
    slots, starts = K.context_slots(prompt, ctx, tables, page)
    assert len(slots) == 12 + 70 and starts.tolist() == [0, 0, 12]
    tiles = torch.tensor(K.extend_tiles(np.where(prompt, qlens, 0)), device=DEV)
    dev = dict(device=DEV)
    bt, cl = torch.tensor(tables, **dev), torch.tensor(ctx, **dev)
    out = torch.zeros(T, heads, dv, dtype=dtype, device=DEV)
    K.mla_prefill(q_nope, q_pe, cache, torch.tensor(slots, **dev), torch.tensor(starts, **dev), query_starts, cl,
                  tiles, kv_b_proj.t().contiguous().to(dtype).to(DEV), scale, out)
    decode_row = torch.tensor([5], dtype=torch.int32, device=DEV)
    out[5:6] = K.mla_attention(q_nope, q_pe, cache, bt, query_starts, cl, w_uk.to(dtype).to(DEV),
                               w_uv.to(dtype).to(DEV), scale, rows=decode_row)
    expected = _reference(q_nope.cpu(), q_pe.cpu(), cache.cpu(), bt.cpu(), query_starts.cpu(), cl.cpu(),
                          w_uk, w_uv, scale)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(out.float().cpu(), expected, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [2, 8])
def test_decode_rows_in_context_splits_equal_the_reference(dtype, splits):
    # A decode step: three streams of one row (contexts of 1, 70 and 200 tokens: splits empty,
    # partly full and full) and a padding stream (context 0); 40 heads over two head blocks.
    skip_interpreted_bf16_dot(dtype)
    g = torch.Generator().manual_seed(7)
    page, blocks, kvr, dr, heads, dn, dv = 16, 64, 288, 16, 40, 24, 20
    cache = torch.randn(blocks, page, kvr + dr, generator=g).to(dtype).to(DEV)
    tables = torch.randperm(blocks, generator=g)[:4 * 13].view(4, 13).to(torch.int32).to(DEV)
    context_lens = torch.tensor([1, 70, 200, 0], dtype=torch.int32, device=DEV)
    query_starts = torch.arange(5, dtype=torch.int32, device=DEV)
    q_nope = torch.randn(4, heads, dn, generator=g).to(dtype).to(DEV)
    q_pe = torch.randn(4, heads, dr, generator=g).to(dtype).to(DEV)
    w_uk = (torch.randn(heads, dn, kvr, generator=g) / dn ** 0.5).to(dtype).to(DEV)
    w_uv = (torch.randn(heads, kvr, dv, generator=g) / kvr ** 0.5).to(dtype).to(DEV)
    scale = (dn + dr) ** -0.5
    ws = K.DecodeWorkspace(1, 4 * heads * splits, kvr, 1, DEV)
    ws.o_part.fill_(float("nan"))  # every split writes its partial, empty ones too
    out = K.mla_attention(q_nope, q_pe, cache, tables, query_starts, context_lens, w_uk, w_uv, scale,
                          splits=splits, ws=ws)
    expected = _reference(q_nope.cpu(), q_pe.cpu(), cache.cpu(), tables.cpu(), query_starts.cpu(),
                          context_lens.cpu(), w_uk.cpu(), w_uv.cpu(), scale)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(out[:3].float().cpu(), expected[:3], **tol)
    assert torch.all(out[3] == 0)  # the padding stream


def test_store_latent_writes_slots_and_skips_negative_ones():
    cache = torch.zeros(3, 4, 10, device=DEV)
    entry = torch.arange(30, dtype=torch.float32, device=DEV).view(3, 10)
    K.store_latent(entry, cache, torch.tensor([5, -1, 11], dtype=torch.int32, device=DEV))
    flat = cache.view(-1, 10).cpu()
    assert torch.equal(flat[5], entry[0].cpu()) and torch.equal(flat[11], entry[2].cpu())
    assert int((flat.abs().sum(-1) > 0).sum()) == 2


@pytest.mark.skipif(not INTERPRETED, reason="on a GPU, tests/test_cuda.py runs the real backend")
@pytest.mark.parametrize("expand", [False, True], ids=["absorbed", "expanded"])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-inputs"])
@pytest.mark.parametrize("name", ["deepseek_v2_greedy_qlora", "deepseek_v3_noaux"])
def test_cuda_backend_runs_deepseek_and_equals_hf(tmp_path, monkeypatch, name, graphs, expand):
    # MLA (q LoRA, YaRN or plain rope) with MoE routing through the CUDA step path, in chunks,
    # in graphs where asked (DecoderModel.graph_capturable). Expanded: every eager step of 2
    # prompt rows or more runs them in the expanded form (chunks after a cached prefix, steps
    # mixed with decode rows); with graphs, those of more than 8 tokens are eager.
    expanded = []
    if expand:
        monkeypatch.setattr(mla_kernels, "EXPAND_MIN_ROWS", 2)
        monkeypatch.setattr(graph_runner, "MAX_GRAPH_TOKENS", 8)
        monkeypatch.setattr(K, "mla_prefill", lambda *a: expanded.append(a[-1].shape[0]) or mla_kernels.mla_prefill(*a))
    assert_greedy_equals_hf(name, tmp_path, monkeypatch, graphs, 6, (30, 7))
    assert bool(expanded) == expand
