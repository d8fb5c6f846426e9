"""The int4 tensor-core kernels (kernels/wint_mma.py): on any machine, that pack() puts each code
where mma.sync's operand fragment (PTX ISA, m16n8k16) and the kernel's placing of the activations
read it, and the launch configs; on a GPU, the GEMV, the widening and the backend's choice against
the exactly dequantized weights."""

import pytest
import torch
from interpreted_triton import DEV, INTERPRETED, gptq_weight

from rtp_llm.device.cuda import kernels as K
from rtp_llm.device.cuda.kernels import wint_mma
from rtp_llm.model_loader.dequant import gptq_codes
from rtp_llm.model_loader.int_weight import from_codes
from rtp_llm.model_loader.quant_config import parse_quant_config
from rtp_llm.tools.quantize import quantize_gptq

# (N, K, group, shuffled): groups of 128 and 64, one group a row, a K of 5 chunks (a warp's last
# chunks past K), a K whose tile needs 24 warps, a partial last group, desc_act's shuffled groups
# (48 and 16 rows: gate and up halves not on whole tiles, which take the plain GEMV and silu_and_mul).
SHAPES = [(64, 256, 128, False), (96, 384, 64, False), (48, 192, 192, False), (32, 320, 64, False),
          (16, 12288, 128, False), (32, 448, 128, False), (64, 512, 128, True)]


def _weight(n, k, group, shuffled=False, seed=0, device=DEV, scale_dtype=torch.float16):
    return gptq_weight(n, k, 4, group, shuffled, seed, device, scale_dtype)


def _stored_codes(w: K.IntLinear) -> torch.Tensor:
    """The codes [N, K] in column order, from the Triton kernels' row layout (8 a word, low first)."""
    q = w.qweight.cpu().unsqueeze(-1) >> torch.arange(0, 32, 4, dtype=torch.int32)
    return (q & 15).reshape(w.shape)


def _codes_by_fragment(p: wint_mma.Int4Mma) -> torch.Tensor:
    """The codes [N, K] as wint4_gemv reads them, derived from the mma.sync m16n8k16 fragment
    layout, not from pack(): lane 4g + t's A register R_s (its word j shifted by 4 s, one LOP3)
    holds rows g (s even) or g + 8 (s odd) at logical columns 2t + 8 (s // 2) + (0, 1), low half
    first; the kernel feeds logical columns 2t + (0, 1) of k-step j the activations 16t + 4j +
    (0, 1), and 2t + 8 + (0, 1) those at 16t + 4j + (2, 3)."""
    n, k = p.shape
    words = p.words.view(n // 16, k // 64, 8, 4, 4).cpu()  # (tile, chunk, g, t, j)
    out = torch.full((n // 16, 16, k // 64, 64), -1, dtype=torch.int32)
    for g in range(8):
        for t in range(4):
            for j in range(4):
                for s in range(4):
                    reg = words[:, :, g, t, j] >> (4 * s)
                    for half in range(2):
                        col = 2 * t + 8 * (s // 2) + half
                        kk = 16 * t + 4 * j + (2 if col >= 8 else 0) + col % 2
                        out[:, g + 8 * (s % 2), :, kk] = (reg >> (16 * half)) & 15
    return out.reshape(n, k)


@pytest.mark.parametrize("n,k,group,shuffled", SHAPES)
def test_pack_puts_each_code_where_the_mma_fragment_reads_it(n, k, group, shuffled):
    _, w = _weight(n, k, group, shuffled, device="cpu")
    assert wint_mma.layout_supports(w, torch.bfloat16)
    p = wint_mma.pack(w, torch.bfloat16)
    assert p.words.dtype == torch.int32 and p.words.numel() == w.qweight.numel()  # the same bytes
    assert torch.equal(_codes_by_fragment(p), _stored_codes(w))
    assert (p.perm is None) == (w.perm is None)
    zero = (p.zb.view(torch.bfloat16).float() - 128).to(torch.int16)
    assert torch.equal(zero, w.zero)  # BIAS + zero, exact


def test_layouts_the_kernels_do_not_take_are_refused():
    _, w = _weight(64, 256, 128, device="cpu")
    assert not wint_mma.layout_supports(w, torch.float32)  # the parity runs' fp32: the exact reference
    for bad in (dict(bits=8), dict(group=32), dict(k=224)):  # 8 bits, groups within a chunk, K of part chunks
        assert not wint_mma.layout_supports(K.IntLinear(**{**w.__dict__, **bad}), torch.bfloat16), bad
    assert not wint_mma.supports(w, torch.bfloat16)  # on the host: the Triton path (interpreted in CI)
    w.zero[0, 0] = 200
    with pytest.raises(ValueError, match="zero points"):
        wint_mma.pack(w, torch.bfloat16)


@pytest.mark.parametrize("k,group", [(4096, 128), (12288, 128), (4096, 4096), (320, 64), (8192, 1024), (384, 192)])
@pytest.mark.parametrize("gated", [False, True])
def test_gemv_config_gives_every_warp_a_run(k, group, gated):
    p = wint_mma.Int4Mma(None, None, None, 32, k, group, torch.bfloat16)
    cpw, warps, lb = wint_mma.gemv_config(p, gated)
    runs = -(-(k // 64) // cpw)
    assert warps == min(wint_mma.MAX_WARPS, runs) and lb == wint_mma.LB >= warps * 32
    gc = p.group_chunks
    assert gc == 0 or cpw % gc == 0 or gc % cpw == 0  # whole groups a run, or a run within one
    with pytest.raises(ValueError, match="groups"):
        wint_mma.gemv_config(wint_mma.Int4Mma(None, None, None, 32, 384, 192, torch.bfloat16), gated, cpw=4)


def test_gemv_config_of_qwen3_8b_is_the_sweeps_best():
    """Chunks a warp for Qwen3-8B's projections (group 128): the H100 sweep's best (docs/benchmarks.md)."""
    cpw = {name: wint_mma.gemv_config(wint_mma.Int4Mma(None, None, None, n, k, 128, torch.bfloat16), gated)[0]
           for name, (n, k, gated) in QWEN3_8B.items()}
    assert cpw == {"qkv": 2, "o": 2, "gate_up": 2, "down": 2}


QWEN3_8B = {"qkv": (6144, 4096, False), "o": (4096, 4096, False), "gate_up": (24576, 4096, True),
            "down": (4096, 12288, False)}

gpu = pytest.mark.skipif(INTERPRETED or not wint_mma.available(), reason="CUDA C kernels: a GPU with NVRTC")


def _close(got, want, tol):
    err = (got.float().cpu() - want).norm() / want.norm()
    assert err < tol, f"relative error {err:.3g}"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("n,k,group,shuffled", SHAPES)
@pytest.mark.parametrize("act,scale_dtype", [(torch.bfloat16, torch.float16), (torch.float16, torch.float16),
                                             (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_gemv_and_widening_equal_the_dequantized_product(n, k, group, shuffled, act, scale_dtype):
    w, packed = _weight(n, k, group, shuffled, seed=n + k, scale_dtype=scale_dtype)
    p = wint_mma.pack(packed, act)
    columns = w if p.perm is None else w[:, p.perm.cpu()]
    assert torch.equal(wint_mma.dequantize(p).cpu(), columns.to(act))
    for m in (1, 2, 3, 4, 8, 9, 37):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(act)
        want = x.float() @ w.t()
        _close(wint_mma.linear(x.to(DEV), p), want, 1e-2)
        out = torch.empty(m, n, dtype=act, device=DEV)
        assert wint_mma.linear(x.to(DEV), p, out=out).data_ptr() == out.data_ptr()
        g, u = want[:, :n // 2], want[:, n // 2:]
        _close(wint_mma.gate_up_silu(x.to(DEV), p, K.silu_and_mul), torch.nn.functional.silu(g) * u, 2e-2)
        if m <= wint_mma.MMA_MAX_ROWS:  # other runs of K (several a warp where K is long): the same sums
            for cpw in (1, 3, 4, 12):
                if wint_mma._fits_groups(cpw, p.group_chunks):
                    _close(wint_mma.gemv(x.to(DEV), p, cpw=cpw), want, 1e-2)
                    if n % 32 == 0:
                        _close(wint_mma.gemv(x.to(DEV), p, gated=True, cpw=cpw), torch.nn.functional.silu(g) * u,
                               2e-2)


@pytest.mark.gpu
@gpu
def test_the_backend_packs_4_bit_weights_for_the_tensor_cores(monkeypatch):
    from rtp_llm.device.cuda.backend import CudaBackend

    c = gptq_codes(quantize_gptq(torch.randn(64, 256) * 0.05), parse_quant_config(
        {"quant_method": "gptq", "bits": 4, "group_size": 128}, "test"), "w", 64, 256)
    t = from_codes(c.codes, c.zeros, c.scales, c.group_of_k, 128, 4, torch.bfloat16)
    be = CudaBackend()
    assert isinstance(be.pack_linear(t), wint_mma.Int4Mma)
    monkeypatch.setenv("RTP_LLM_CUDA_WINT_MMA", "0")
    assert isinstance(be.pack_linear(t), K.IntLinear)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", sorted(QWEN3_8B))
@pytest.mark.parametrize("group", [64, 128, 4096])
def test_the_chosen_gemv_configs_fit_their_registers(name, group):
    """The configs gemv_config picks spill nothing with this GPU's NVRTC (a spill is slow, not wrong)."""
    from rtp_llm.device.cuda.kernels import nvrtc

    n, k, gated = QWEN3_8B[name]
    p = wint_mma.Int4Mma(None, torch.empty(0, dtype=torch.float16), None, n, k, group, torch.bfloat16)
    cpw, _, lb = wint_mma.gemv_config(p, gated)
    kernel = wint_mma._kernel("wint4_gemv", wint_mma._defines(p, f"CPW={cpw}", f"LB={lb}", f"GATED={int(gated)}"))
    assert nvrtc.local_bytes(kernel) == 0, (cpw, gated)
