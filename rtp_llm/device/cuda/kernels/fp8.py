"""FP8 (e4m3) projections on Hopper: an FP8 checkpoint's weights computed on as stored, half the
bytes of bf16 (model_loader/fp8_weight.py gives them; one scale layout, a grid of bn x bk blocks).

- M <= GEMV_MAX_ROWS rows (decode at small batch, bound by the weight read): gemv.py's kernel
  reads the e4m3 weight and applies its scales, on activations as they are (W8A16).
- More rows, one scale per weight row (per-tensor and per-channel checkpoints): activations
  quantized per row to e4m3 (quantize_rows), then cuBLASLt's FP8 GEMM with row-wise scales
  (torch._scaled_mm).
- More rows, bn x bk scale blocks (block-FP8: Qwen3-*-FP8, DeepSeek-V3): activations quantized
  per row and bk inputs (1 x bk groups, the weight's K blocks), then block_gemm: each K tile is
  one block of inputs, its fp32 partial product scaled by the row's and the column's scales.

Dynamic activation scales are what vLLM and SGLang use for these formats; a checkpoint's static
`input_scale` is not read (docs/engine.md)."""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from rtp_llm.device.cuda.kernels.gemv import GEMV_MAX_ROWS, gemv
from rtp_llm.device.cuda.kernels.launch import grouped_tile, launch_options, pdl_enter

@dataclass
class Fp8Linear:
    """A packed FP8 projection: weight e4m3 [N, K] contiguous (HF's [out, in]), scale fp32
    [ceil(N / bn), ceil(K / bk)], block (bn, bk); per-row scales: bn 1, bk >= K."""

    weight: torch.Tensor
    scale: torch.Tensor
    block: Tuple[int, int]

    @property
    def shape(self):
        return self.weight.shape

    @property
    def row_scaled(self) -> bool:
        return self.block[0] == 1 and self.block[1] >= self.weight.shape[1]


def supports(n: int, k: int, block: Tuple[int, int]) -> bool:
    """Whether these kernels take an [N, K] weight in `block`s: per-row scales (cuBLASLt's FP8
    GEMM) N and K multiples of 16; blocks (block_gemm) a power-of-two bk of 32..256 (one K tile
    a block of inputs)."""
    bn, bk = block
    if bn == 1 and bk >= k:
        return n % 16 == 0 and k % 16 == 0
    return 32 <= bk <= 256 and bk & (bk - 1) == 0


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, stride_s, GROUP: tl.constexpr,
                          BLOCK_G: tl.constexpr, GROUPS: tl.constexpr, PDL: tl.constexpr):
    """Row pid(0)'s groups [pid(1) GROUPS, + GROUPS) of GROUP inputs as e4m3 codes q = x / s with
    s = amax / 448 (e4m3's largest finite value; at least 1e-12, so an all-zero group's codes are
    zeros); BLOCK_G >= GROUP (a power of two). GROUP may be the whole row (one scale a row)."""
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    j = tl.arange(0, BLOCK_G)
    offs = g[:, None] * GROUP + j[None, :]
    mask = (offs < K) & (j < GROUP)[None, :]
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(x), 1) / 448.0, 1e-12)
    q = tl.clamp(x / s[:, None], -448.0, 448.0)
    tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_s + g, s, mask=g * GROUP < K)


def quantize_rows(x: torch.Tensor, group: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (unit stride along K) -> (e4m3 codes [M, K], fp32 scales [M, ceil(K / group)]),
    x ~ codes x scale per row and group of inputs. A program takes ~2K inputs of a row."""
    m, k = x.shape
    groups = triton.cdiv(k, group)
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((m, groups), dtype=torch.float32, device=x.device)
    if m:
        block_g = triton.next_power_of_2(group)
        per = min(triton.next_power_of_2(groups), max(1, 2048 // block_g))
        _quantize_rows_kernel[(m, triton.cdiv(groups, per))](
            x, q, s, k, x.stride(0), q.stride(0), s.stride(0), GROUP=group, BLOCK_G=block_g, GROUPS=per,
            num_warps=8 if per * block_g >= 4096 else 4, **launch_options())
    return q, s


@triton.jit
def _block_gemm_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M, N, K, stride_a, stride_as, stride_bs, stride_c,
                       BN_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, PDL: tl.constexpr):
    """c [M, N] = sum over K tiles t of (a[:, t] . b[:, t]^T) x as[m, t] x bs[n / BN_S, t]: a e4m3
    [M, K] with as fp32 [M, K / BLOCK_K], b e4m3 [N, K] with bs fp32 [ceil(N / BN_S), K / BLOCK_K];
    BLOCK_K is the scales' block of inputs. Programs walk GROUP_M row tiles per column tile (L2 reuse)."""
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mmask, nmask = offs_m < M, offs_n < N
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_a + offs_k[None, :]
    b_ptrs = b_ptr + offs_n.to(tl.int64)[None, :] * K + offs_k[:, None]
    as_ptrs = as_ptr + offs_m * stride_as
    bs_ptrs = bs_ptr + (offs_n // BN_S) * stride_bs
    pdl_enter(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = offs_k < K - t * BLOCK_K
        a = tl.load(a_ptrs, mask=mmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
        sa = tl.load(as_ptrs + t, mask=mmask, other=0.0)
        sb = tl.load(bs_ptrs + t, mask=nmask, other=0.0)
        acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    c = c_ptr + offs_m.to(tl.int64)[:, None] * stride_c + offs_n[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def block_gemm_config(m: int) -> dict:
    """Tiles by row count (BLOCK_K is the scales' bk): few rows (decode batches) narrow tiles,
    so that an 8B model's 4096-wide projections still give every SM programs; many rows
    (prompt chunks) 128 x 128."""
    if m <= 16:
        return dict(BLOCK_M=16, BLOCK_N=32, GROUP_M=1, num_warps=4, num_stages=4)
    if m <= 64:
        return dict(BLOCK_M=32 if m <= 32 else 64, BLOCK_N=64, GROUP_M=1, num_warps=4, num_stages=4)
    if m <= 512:
        return dict(BLOCK_M=64, BLOCK_N=64, GROUP_M=8, num_warps=4, num_stages=4)
    return dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, num_warps=8, num_stages=3)


def block_gemm(a: torch.Tensor, a_scale: torch.Tensor, w: Fp8Linear, out: torch.Tensor) -> torch.Tensor:
    m, k = a.shape
    n = w.weight.shape[0]
    bn, bk = w.block
    cfg = block_gemm_config(m)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _block_gemm_kernel[grid](a, a_scale, w.weight, w.scale, out, m, n, k, a.stride(0), a_scale.stride(0),
                             w.scale.stride(0), out.stride(0), BN_S=bn, BLOCK_K=bk, **cfg, **launch_options())
    return out


def fp8_linear(x: torch.Tensor, w: Fp8Linear, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] (bf16 / fp16) -> x W^T [M, N] in x's dtype, into `out` when given (contiguous)."""
    m, n = x.shape[0], w.weight.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()
    if 0 < m <= GEMV_MAX_ROWS:
        return gemv(x, w.weight, out=out, scale=w.scale, block=w.block)
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    if w.row_scaled:
        q, s = quantize_rows(x, x.shape[1])
        res = torch._scaled_mm(q, w.weight.t(), scale_a=s, scale_b=w.scale.view(1, n), out_dtype=x.dtype)
        return out.copy_(res)
    q, s = quantize_rows(x, w.block[1])
    return block_gemm(q, s, w, out)


def fp8_gate_up_silu(x: torch.Tensor, w: Fp8Linear, silu_and_mul) -> torch.Tensor:
    """silu(x gate^T) * (x up^T) for a fused [2 I, K] FP8 gate_up (gate rows then up rows):
    the GEMV's epilogue at small batch, else the projection then silu_and_mul."""
    if 0 < x.shape[0] <= GEMV_MAX_ROWS:
        return gemv(x if x.stride(1) == 1 else x.contiguous(), w.weight, gated=True, scale=w.scale, block=w.block)
    return silu_and_mul(fp8_linear(x, w))
