"""The CUDA backend's weight-only integer projections (kernels/wint.py: GPTQ / AWQ codes read as
stored) against the exactly dequantized weights, and a GPTQ / AWQ checkpoint through the CUDA step
path against HF on those weights. Without a GPU the kernels run in Triton's interpreter."""

from pathlib import Path

import pytest
import torch
from interpreted_triton import DEV, INTERPRETED, gptq_weight, hf_step_logits, step_logits

from rtp_llm.device.cuda import kernels as K
from rtp_llm.device.cuda.kernels.wint import DEQUANT_MIN_ROWS
from rtp_llm.model_loader.dequant import gptq_codes
from rtp_llm.model_loader.int_weight import from_codes
from rtp_llm.model_loader.quant_config import parse_quant_config
from rtp_llm.tools.quantize import quantize_gptq

# (N, K, bits, group, shuffled): 4-bit groups of 32 and 128, a partial last group of 48, desc_act's
# shuffled groups, one group a row, 8-bit.
WEIGHTS = [(64, 256, 4, 32, False), (96, 384, 4, 128, False), (40, 128, 4, 48, False), (64, 256, 4, 32, True),
           (48, 160, 4, 160, False), (32, 192, 8, 64, False), (64, 256, 8, 32, True)]
ACT = torch.float32 if INTERPRETED else torch.bfloat16  # (the interpreter's bf16 tl.dot is wrong)


def _weight(n, k, bits, group, shuffled, seed=0):
    return gptq_weight(n, k, bits, group, shuffled, seed)


def _close(got, want, tol):
    err = (got.float().cpu() - want).norm() / want.norm()
    assert err < tol, f"relative error {err:.3g}"


@pytest.mark.parametrize("n,k,bits,group,shuffled", WEIGHTS)
@pytest.mark.parametrize("m", [1, 3, 4, 5, 37, DEQUANT_MIN_ROWS])
def test_projection_equals_the_dequantized_product(n, k, bits, group, shuffled, m):
    assert K.wint_supports(k, group, bits)
    w, packed = _weight(n, k, bits, group, shuffled, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(ACT)
    want = x.float() @ w.t()
    tol = 1e-5 if ACT == torch.float32 else 1e-2  # bf16: the output's rounding (and the GEMM's weights')
    _close(K.wint_linear(x.to(DEV), packed), want, tol)
    out = torch.empty(m, n, dtype=ACT, device=DEV)
    assert K.wint_linear(x.to(DEV), packed, out=out).data_ptr() == out.data_ptr()
    gated = K.wint_gate_up_silu(x.to(DEV), packed, K.silu_and_mul)
    g, u = want[:, :n // 2], want[:, n // 2:]
    _close(gated, torch.nn.functional.silu(g) * u, 2 * tol if m > K.GEMV_MAX_ROWS else 2e-2)


@pytest.mark.parametrize("n,k,bits,group,shuffled", WEIGHTS)
@pytest.mark.parametrize("m", [1, 3])
def test_gemv_tiles_walk_the_whole_row(n, k, bits, group, shuffled, m):
    """Configs other than the default: runs of fewer words than a group, one or several runs an
    iteration, partial last iterations and programs; rows split into word ranges (more ranges
    than a row has runs too: empty ones), gated and not, twice in a row (the counters are back
    to zero after each launch)."""
    from rtp_llm.device.cuda.kernels import wint

    w, packed = _weight(n, k, bits, group, shuffled, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(ACT)
    want = x.float() @ w.t()
    g, u = want[:, :n // 2], want[:, n // 2:]
    tol = 1e-5 if ACT == torch.float32 else 1e-2
    # (BLOCK_N, BLOCK_W, RUNS, num_warps[, SPLIT])
    for config in [(16, 2, 3, 4), (64, 1, 1, 4)]:
        _close(wint.gemv(x.to(DEV), packed, config=config), want, tol)
    for config in [(16, 2, 3, 4, 2), (8, 1, 1, 4, 4), (4, 2, 1, 4, 16)]:
        for _ in range(2):
            _close(wint.gemv(x.to(DEV), packed, config=config), want, tol)
    gated = wint.gemv(x.to(DEV), packed, gated=True, config=(8, 1, 1, 4, 4))
    _close(gated, torch.nn.functional.silu(g) * u, 2e-2 if ACT != torch.float32 else 2 * tol)
    with pytest.raises(ValueError, match="power of two"):
        wint.gemv(x.to(DEV), packed, config=(16, 1, 1, 4, 3))
    if group < k:  # a run of words lies within one group
        with pytest.raises(ValueError, match="spans groups"):
            wint.gemv(x.to(DEV), packed, config=(1, 64, 1, 4))


def test_gemv_config_fills_the_sms_with_ranges_of_whole_runs(monkeypatch):
    """The default GEMV splits a row's words until the SMs have GEMV_PROGRAMS_PER_SM programs each,
    never into ranges shorter than GEMV_MIN_RUNS runs or more than GEMV_MAX_SPLIT of them: on an
    H100's 132 SMs, Qwen3-8B's projections get the sweep's best splits (docs/benchmarks.md)."""
    from rtp_llm.device.cuda.kernels import wint

    monkeypatch.setattr(wint, "num_sms", lambda device: 132)

    def config(n, k, rows=None, group=128):
        words = torch.empty((rows or n, k // 8), dtype=torch.int32, device="meta")
        return wint.gemv_config(n, K.IntLinear(words, words, words, None, group, 4, k))

    # (N, K, stored rows): qkv, o, gate_up gated (N counts outputs: twice the rows), down
    assert [config(*s)[4] for s in [(6144, 4096), (4096, 4096), (12288, 4096, 24576), (4096, 12288)]] == \
        [16, 16, 8, 16]
    for n, k in [(4096, 1024), (1024, 1024), (151936, 1024), (64, 256)]:
        block_n, block_w, runs, _, split = config(n, k)
        chunk = k // 8 // split
        assert chunk >= wint.GEMV_MIN_RUNS * block_w * runs and split <= wint.GEMV_MAX_SPLIT
        assert split == 1 or -(-n // block_n) * split // 2 < wint.GEMV_PROGRAMS_PER_SM * 132


def test_unsupported_groups_are_refused():
    assert not K.wint_supports(256, 40, 4)   # a K tile of 16 would span two groups
    assert not K.wint_supports(252, 252, 4)  # K not whole words
    assert K.wint_supports(252, 252, 8) and K.wint_supports(256, 48, 4)


def test_the_backend_keeps_what_its_kernels_take(monkeypatch):
    from interpreted_triton import InterpretedCudaBackend

    be = InterpretedCudaBackend.make(graphs=False)
    c = gptq_codes(quantize_gptq(torch.randn(64, 256) * 0.05), parse_quant_config(
        {"quant_method": "gptq", "bits": 4, "group_size": 128}, "test"), "w", 64, 256)
    for dtype, kept in ((torch.bfloat16, True), (torch.float16, True), (torch.float32, False)):
        t = from_codes(c.codes, c.zeros, c.scales, c.group_of_k, 128, 4, dtype)
        assert be.keeps_quantized(t) == kept, dtype  # fp32: widened, the exact reference
    monkeypatch.setenv("RTP_LLM_CUDA_WINT", "0")
    assert not be.keeps_quantized(t.__class__(**{**t.__dict__, "dtype": torch.bfloat16}))
    packed = be.pack_linear(t)
    assert isinstance(packed, K.IntLinear) and packed.qweight.dtype == torch.int32 and packed.shape == (64, 256)


def test_gptq_checkpoint_through_the_step_path(tmp_path, monkeypatch):
    """A GPTQ checkpoint (the quantize tool's) through the CUDA step path (bf16 on a GPU;
    interpreted in fp32, where the backend keeps the codes for the test): prefill and decode
    logits of short (GEMV) and long (GEMM) prompts equal HF's fp32 model on the exactly
    dequantized weights."""
    from interpreted_triton import dequantized_checkpoint
    from testlib import make_tiny, random_prompts

    from rtp_llm.llm import LLM
    from rtp_llm.model_loader.int_weight import GroupIntTensor
    from rtp_llm.tools.quantize import write

    src = make_tiny("qwen3_gqa_untied", str(tmp_path / "src"))
    ckpt = write(src, str(tmp_path / "gptq"), "gptq")
    if INTERPRETED:
        from interpreted_triton import InterpretedCudaBackend, interpreted_cuda_llm

        backend = InterpretedCudaBackend.make(graphs=False)
        monkeypatch.setattr(backend, "keeps_quantized", lambda w: isinstance(w, GroupIntTensor))  # fp32 too, here
        llm = interpreted_cuda_llm(ckpt, monkeypatch, backend, max_num_batched_tokens=128)
        tol = 1e-5
    else:
        llm = LLM(ckpt, device="cuda", act_type="bf16", progress=False, max_seq_len=256)
        tol = 2e-2  # bf16 activations and outputs (HF's own bf16 run errs by 1-2% here)
    prompts = random_prompts(7, [1, 3, 40, 90])
    try:
        assert isinstance(llm.engine.runner.model.layers[0].qkv, (K.IntLinear, K.Int4Mma))
        got = [step_logits(llm, p) for p in prompts]
    finally:
        llm.close()
    ref = dequantized_checkpoint(ckpt, src, str(tmp_path / "ref"))
    for prompt, (logits, tokens) in zip(prompts, got):
        for g, w in zip(logits, hf_step_logits(ref, prompt, tokens[0], DEV)):  # prefill, then decode
            assert ((g - w).norm() / w.norm()).item() < tol, len(prompt)


@pytest.mark.parametrize("n,k,bits,group,shuffled", WEIGHTS)
def test_dequantize_gives_the_exact_values(n, k, bits, group, shuffled):
    from rtp_llm.device.cuda.kernels.wint import dequantize

    w, packed = _weight(n, k, bits, group, shuffled)
    assert torch.equal(dequantize(packed, torch.float32).cpu(), w)
    if not INTERPRETED:  # (Triton 3.6's interpreter truncates fp32 to bf16 instead of rounding it)
        assert torch.equal(dequantize(packed, torch.bfloat16).cpu(), w.to(torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED, reason="--quantization=int8 computes on CUDA's int kernels only with a GPU")
def test_quantization_int8_at_load_runs_on_the_int_kernels(tmp_path):
    """--quantization=int8 on CUDA: each projection becomes int8 codes with a scale per row at load
    (quantize_at_load_test checks the codes), computed on the int kernels: the logits of short
    (GEMV) and long (GEMM) prompts are HF's on those weights dequantized."""
    from safetensors.torch import save_file
    from testlib import make_tiny, random_prompts

    from rtp_llm.llm import LLM
    from rtp_llm.model_loader import load_model
    from rtp_llm.model_loader.quantize_at_load import quantize_weights

    src = make_tiny("qwen3_gqa_untied", str(tmp_path / "src"))
    loaded = load_model(src, dtype=torch.bfloat16, progress=False)
    weights = dict(loaded.weights)
    assert quantize_weights(weights, "int8", loaded.config, "cuda") > 0
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    save_file({k: (v.dequantize() if hasattr(v, "dequantize") else v).float().contiguous() for k, v in weights.items()},
              str(ref_dir / "model.safetensors"))
    (ref_dir / "config.json").write_text((Path(src) / "config.json").read_text())  # make_tiny: its directory
    llm = LLM(src, device="cuda", act_type="bf16", progress=False, max_seq_len=256, cuda_graph=False,
              quantization="int8")
    prompts = random_prompts(7, [1, 3, 40])
    try:
        qkv = llm.engine.runner.model.layers[0].qkv
        assert isinstance(qkv, K.IntLinear) and qkv.bits == 8
        ours = [step_logits(llm, p) for p in prompts]
    finally:
        llm.close()
    for prompt, (got, tokens) in zip(prompts, ours):
        for g, w in zip(got, hf_step_logits(str(ref_dir), prompt, tokens[0], DEV)):
            assert ((g - w).norm() / w.norm()).item() < 2e-2, len(prompt)
