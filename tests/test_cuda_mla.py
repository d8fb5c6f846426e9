"""The CUDA backend's latent attention (kernels/mla.py) against a dense torch reference, and
DeepSeek-V2/V3 models through the CUDA step path. Without a GPU through Triton's interpreter."""

import pytest
import torch
from interpreted_triton import DEV, DTYPES, INTERPRETED, assert_greedy_equals_hf, skip_interpreted_bf16_dot

from rtp_llm.device.cuda import kernels as K


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


def test_store_latent_writes_slots_and_skips_negative_ones():
    cache = torch.zeros(3, 4, 10, device=DEV)
    entry = torch.arange(30, dtype=torch.float32, device=DEV).view(3, 10)
    K.store_latent(entry, cache, torch.tensor([5, -1, 11], dtype=torch.int32, device=DEV))
    flat = cache.view(-1, 10).cpu()
    assert torch.equal(flat[5], entry[0].cpu()) and torch.equal(flat[11], entry[2].cpu())
    assert int((flat.abs().sum(-1) > 0).sum()) == 2


@pytest.mark.skipif(not INTERPRETED, reason="on a GPU, tests/test_cuda.py runs the real backend")
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-inputs"])
@pytest.mark.parametrize("name", ["deepseek_v2_greedy_qlora", "deepseek_v3_noaux"])
def test_cuda_backend_runs_deepseek_and_equals_hf(tmp_path, monkeypatch, name, graphs):
    # MLA (q LoRA, YaRN or plain rope) with MoE routing through the CUDA step path, in chunks,
    # in graphs where asked (DecoderModel.graph_capturable).
    assert_greedy_equals_hf(name, tmp_path, monkeypatch, graphs, 6, (30, 7))
