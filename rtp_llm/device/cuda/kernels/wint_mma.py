"""4-bit GPTQ / AWQ projections on the tensor cores: the codes repacked at load (pack) into the
layout of mma.sync's operand, a GEMV for up to MMA_MAX_ROWS activation rows (wint_mma_src.py's
wint4_gemv: one m16n8k16 per 16 x 16 codes, the decode a LOP3 and half a packed subtraction a
code, against the Triton GEMV's three fp32 instructions; kernels/wint.py), and the widened weight
through cuBLAS above that. CUDA C compiled at first use with NVRTC (torch.cuda._compile_kernel);
where that is missing, or for a weight these kernels do not take (supports), kernels/wint.py's
Triton path serves the weight as stored. A desc_act weight (columns sorted by group, `perm` naming
each column's input) takes its activations gathered into column order first (one small gather).

Layout (Int4Mma.words, int32): the weight [N, K] in tiles of 16 rows x 64 inputs ("chunks"), tile
by tile, each tile chunk by chunk, 32 lanes x 4 words a chunk, so a warp reads a chunk as 512
contiguous bytes and a lane its 16 (one word per k-step j of the chunk's four). Lane L = 4 g + t
holds in nibble b = 4 h + 2 s1 + s0 of word j the code of row 16 tile + g + 8 s0 and input
64 chunk + 16 t + 4 j + 2 s1 + h. That is mma.sync's A fragment (registers R_s = nibbles s and
s + 4: rows g and g + 8, logical columns 2t, 2t + 1 and 2t + 8, 2t + 9) with the logical columns of
k-step j placed on inputs 16t + 4j + (0, 1) and 16t + 4j + (2, 3); the activations' B fragment is
placed the same way, so a lane's activations for a chunk are 16 consecutive inputs (two 16-byte
loads) and the sum over K is unchanged."""

import functools
import logging
import os
from dataclasses import dataclass
from typing import Optional

import torch

from rtp_llm.device.cuda.kernels import nvrtc
from rtp_llm.device.cuda.kernels.wint import IntLinear
from rtp_llm.device.cuda.kernels.wint_mma_src import SOURCE

log = logging.getLogger(__name__)

MMA_MAX_ROWS = 8  # the mma's N: activation rows one GEMV takes
_BIAS = {torch.bfloat16: 128.0, torch.float16: 1024.0}  # wint_mma_src's BIAS: one ulp is 1 there
_SCALE_DEFINE = {torch.bfloat16: (), torch.float16: ("SCALE_F16",), torch.float32: ("SCALE_F32",)}
_PACK_ROWS = 2048  # rows packed at a time (the codes' int64 transient: 64 bytes a weight)


@dataclass
class Int4Mma:
    """A packed int4 projection: words int32 [N / 16 * K / 64 * 128] (the layout above); scale
    [N, G] as stored; zb int16 [N, G], the bits of BIAS + zero in `dtype` (the activations'); perm
    int64 [K] (column j is input perm[j]) or None."""

    words: torch.Tensor
    scale: torch.Tensor
    zb: torch.Tensor
    n: int
    k: int
    group: int
    dtype: torch.dtype
    perm: Optional[torch.Tensor] = None

    @property
    def shape(self):
        return (self.n, self.k)

    @property
    def group_chunks(self) -> int:
        """Chunks a group; 0 where one group spans the row."""
        return 0 if self.group >= self.k else self.group // 64


def available() -> bool:
    """NVRTC through torch, and not turned off (RTP_LLM_CUDA_WINT_MMA=0 keeps the Triton path)."""
    return hasattr(torch.cuda, "_compile_kernel") and os.environ.get("RTP_LLM_CUDA_WINT_MMA", "1") != "0"


def layout_supports(w: IntLinear, dtype: torch.dtype) -> bool:
    """4 bits, whole tiles and chunks, groups of whole chunks, bf16 / fp16 activations."""
    n, k = w.shape
    return (w.bits == 4 and dtype in _BIAS and n % 16 == 0 and k % 64 == 0
            and (w.group >= k or w.group % 64 == 0) and w.scale.dtype in _SCALE_DEFINE)


def supports(w: IntLinear, dtype: torch.dtype) -> bool:
    """Whether these kernels serve w: its layout, on a GPU where they compile."""
    return (available() and w.qweight.is_cuda and layout_supports(w, dtype)
            and _compiles(w.qweight.device.index))


@functools.lru_cache(maxsize=None)
def _compiles(device: int) -> bool:
    """Whether NVRTC builds the source for `device` (asked once, at its first weight: a failure leaves
    every weight on the Triton path, with the reason in the log, rather than failing a forward; the
    packed subtraction needs sm_90, so earlier GPUs take that path)."""
    try:
        with torch.cuda.device(device):
            _kernel("wint4_gemv", ("GC=2", "CPW=4", f"LB={LB}", "GATED=0"))
        return True
    except Exception as e:  # (no NVRTC library, an older toolkit, ...)
        log.warning("int4 tensor-core kernels unavailable (%s): GPTQ / AWQ weights take the Triton kernels", e)
        return False


def pack(w: IntLinear, dtype: torch.dtype) -> Int4Mma:
    """w's codes in the layout above (on w's device). Zero points must be in [0, 127] (BIAS + zero
    exact in bf16); GPTQ and AWQ 4-bit zeros are in [0, 16]."""
    assert layout_supports(w, dtype)
    n, k = w.shape
    zmin, zmax = int(w.zero.min()), int(w.zero.max())
    if zmin < 0 or zmax > 127:
        raise ValueError(f"int4 zero points must lie in [0, 127], got [{zmin}, {zmax}]")
    dev = w.qweight.device
    nib = torch.arange(0, 32, 4, device=dev, dtype=torch.int32)
    parts = []
    for r0 in range(0, n, _PACK_ROWS):
        q = (w.qweight[r0:r0 + _PACK_ROWS].unsqueeze(-1) >> nib) & 15  # [rows, K / 8, 8]: input 8 word + i
        q = q.reshape(-1, 2, 8, k // 64, 4, 4, 2, 2)  # (tile, s0, g, chunk, t, j, s1, h)
        q = q.permute(0, 3, 2, 4, 5, 7, 6, 1).reshape(-1, 8)  # (tile, chunk, g, t, j, h, s1, s0)
        words = (q.to(torch.int64) << nib.to(torch.int64)).sum(-1)
        parts.append((words - ((words >> 31) << 32)).to(torch.int32))  # two's complement of the 32 bits
    zb = (w.zero.to(torch.float32) + _BIAS[dtype]).to(dtype).view(torch.int16).contiguous()
    perm = None if w.perm is None else w.perm.to(torch.int64)
    return Int4Mma(torch.cat(parts), w.scale.contiguous(), zb, n, k, w.group, dtype, perm)


def _in_column_order(x: torch.Tensor, w: Int4Mma) -> torch.Tensor:
    return x if w.perm is None else x.index_select(1, w.perm)


def _kernel(name: str, defines: tuple):
    return nvrtc.kernel(SOURCE, name, defines)


def _defines(w: Int4Mma, *extra) -> tuple:
    act = ("ACT_F16",) if w.dtype == torch.float16 else ()
    return act + _SCALE_DEFINE[w.scale.dtype] + (f"GC={w.group_chunks}",) + extra


# Chunks a warp's run by default: the best of 2, 4, 6 and 8 for o, gate_up (plain and gated) and
# down in an H100 sweep with PDL (`bench_wint --sweep mma`; docs/benchmarks.md, session 32), where
# small runs keep two 512-thread blocks on an SM; qkv alone ran faster at 8 (7.6 against 8.7 us).
DEFAULT_CPW = 2
MAX_WARPS = 16  # a block's; LB = 512 threads, so a thread may hold 128 registers
LB = MAX_WARPS * 32


def _fits_groups(cpw: int, gc: int) -> bool:
    """A warp's run holds whole groups or lies within one (wint4_gemv's WHOLE_GROUPS / NG)."""
    return gc == 0 or cpw % gc == 0 or gc % cpw == 0


def gemv_config(w: Int4Mma, gated: bool, cpw: int = 0):
    """(CPW, warps, LB): chunks a warp's run (all its words and activations loaded before its first
    mma), warps a block (one tile's K taken in runs of CPW chunks by at most MAX_WARPS warps, each
    with at least one run), the launch bound. By default DEFAULT_CPW, or the largest run below it
    that neither splits a group nor spans part of two."""
    kc = w.k // 64
    gc = w.group_chunks
    if not cpw:
        cpw = max(c for c in range(1, DEFAULT_CPW + 1) if _fits_groups(c, gc))
    if not _fits_groups(cpw, gc):
        raise ValueError(f"{cpw} chunks a warp neither hold whole groups of {gc} chunks nor lie in one")
    return cpw, min(MAX_WARPS, -(-kc // cpw)), LB


def gemv(x: torch.Tensor, w: Int4Mma, out: torch.Tensor = None, gated: bool = False, cpw: int = 0) -> torch.Tensor:
    """x [M <= MMA_MAX_ROWS, K] in w.dtype -> x W^T [M, N] (gated: W is [2 I, K], gate rows then up,
    and the result silu(gate) * up [M, I]); into `out` when given (contiguous)."""
    m, k = x.shape
    n = w.n // 2 if gated else w.n
    assert m <= MMA_MAX_ROWS and k == w.k and x.dtype == w.dtype
    assert not gated or n % 16 == 0, "gated: the up rows must start on a 16-row tile"
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.is_contiguous()
    if m == 0:
        return out
    x = _in_column_order(x, w)
    if x.stride(1) != 1 or x.data_ptr() % 16 or x.stride(0) % 8:  # (16-byte loads of 8 activations)
        x = x.clone(memory_format=torch.contiguous_format)  # (contiguous() keeps a misaligned view)
    cpw, warps, lb = gemv_config(w, gated, cpw)  # (gated: the same runs, twice the words)
    kernel = _kernel("wint4_gemv", _defines(w, f"CPW={cpw}", f"LB={lb}", f"GATED={int(gated)}"))
    nvrtc.launch(kernel, n // 16, warps * 32,
                 [x, x.stride(0), m, w.words, w.scale, w.zb, w.scale.shape[1], out, out.stride(0), n // 16, k // 64],
                 shared_mem=warps * 32 * 8 * 4)
    return out


def dequantize(w: Int4Mma) -> torch.Tensor:
    """W [N, K] in w.dtype, each value (q - zero) * scale rounded once (kernels/wint.dequantize's), in
    column order (input perm[j] at column j)."""
    out = torch.empty((w.n, w.k), dtype=w.dtype, device=w.words.device)
    words = w.words.numel()
    _kernel("wint4_dequant", _defines(w))(grid=(-(-words // 256), 1, 1), block=(256, 1, 1),
                                          args=[w.words, w.scale, w.zb, w.scale.shape[1], w.group_chunks, out, w.k,
                                                w.k // 64, words])
    return out


def linear(x: torch.Tensor, w: Int4Mma, out: torch.Tensor = None) -> torch.Tensor:
    """x [M, K] -> x W^T [M, N]: the GEMV up to MMA_MAX_ROWS rows, the widened weight on cuBLAS above."""
    if x.shape[0] <= MMA_MAX_ROWS:
        return gemv(x, w, out)
    return _widened(x, w, out)


def _widened(x: torch.Tensor, w: Int4Mma, out: torch.Tensor = None) -> torch.Tensor:
    return torch.mm(_in_column_order(x, w), dequantize(w).t(), out=out)


def gate_up_silu(x: torch.Tensor, w: Int4Mma, silu_and_mul) -> torch.Tensor:
    """silu(x gate^T) * (x up^T) for a fused [2 I, K] gate_up: the GEMV's epilogue at small batch
    (where the up rows start on a tile: I a multiple of 16; else the plain GEMV, then
    silu_and_mul), the widened weight above."""
    if x.shape[0] <= MMA_MAX_ROWS:
        return gemv(x, w, gated=True) if w.n % 32 == 0 else silu_and_mul(gemv(x, w))
    return silu_and_mul(_widened(x, w))
