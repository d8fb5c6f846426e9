"""Weight-only integer projections (GPTQ and AWQ checkpoints, 4 or 8 bits, groups of inputs): the
packed codes are read as stored (model_loader/int_weight.py's row layout: output channel n's
codes along K, 32 / BITS a word, low bits first), so a decode step streams a quarter (int4) of a
bf16 weight's bytes. W[n, perm[j]] = (q[n, j] - zero[n, j // GROUP]) * scale[n, j // GROUP].

- M <= GEMV_MAX_ROWS rows: a GEMV. Each program streams BLOCK_N rows' words in runs of BLOCK_W
  words within one group (RUNS runs an iteration), sums (q - zero) x over each run's codes and
  scales that by the group's scale (one scale and zero a row and run, not one a weight). With
  SPLIT > 1 the words of a row are split into SPLIT ranges, one program each (a GEMV over a
  quarter of bf16's bytes has too few programs, each with too long a chain of loads, to keep the
  memory busy): each writes its fp32 partial sums, and the last of a row block's programs to
  finish (a counter per row block) adds them in split order and writes the output.
- More rows, up to DEQUANT_MIN_ROWS: a GEMM whose K tiles lie within one group: the tile's
  words are read once each, along K, unpacked in registers and scaled into the activations'
  dtype, then tl.dot (tensor cores).
- More rows still: the weight widened (dequantize) and cuBLAS.

At one row the GEMV is bound by arithmetic as much as by the weights' bytes (8 codes a 4-byte
word), so a code costs as few instructions as it can: no integer-to-float conversion (16 a
clock per SM on Hopper): q | 0x4B000000 read as an fp32 is 2^23 + q exactly, and the zero point
is taken as 2^23 + zero, so one float subtraction gives (q - zero) exactly; and no shift per code
(_run_dot). A desc_act weight's columns are in group order: the kernels read the
activations through perm."""

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from rtp_llm.device.cuda.kernels.gemv import GEMV_MAX_ROWS
from rtp_llm.device.cuda.kernels.launch import grouped_tile, launch_options, num_sms, pdl_enter

_MAGIC = tl.constexpr(0x4B000000)  # the bits of 2^23 as an fp32: a code OR-ed into its mantissa is added
_MAGIC_F = tl.constexpr(8388608.0)

# gemv_config's tile and split: enough programs to fill the SMs several times over, ranges of at
# least two runs (the partial sums' writes and the final add stay small beside the weights' reads).
GEMV_BLOCK_N = 64
GEMV_PROGRAMS_PER_SM = 8
GEMV_MIN_RUNS = 2
GEMV_MAX_SPLIT = 16


@dataclass
class IntLinear:
    """A packed projection on the device: qweight int32 [N, K * bits / 32]; scale [N, G] (fp16 /
    bf16 / fp32 as stored), zero int16 [N, G], G = ceil(K / group); perm int32 [K] or None."""

    qweight: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    perm: Optional[torch.Tensor]
    group: int
    bits: int
    k: int

    @property
    def shape(self):
        return (self.qweight.shape[0], self.k)


def supports(k: int, group: int, bits: int) -> bool:
    """Whether these kernels take such a weight: the GEMM's K tiles (16 inputs at least, tl.dot's
    least) must each lie within one group."""
    return bits in (4, 8) and k % (32 // bits) == 0 and (group >= k or group % 16 == 0)


def _gemm_block_k(group: int, k: int) -> int:
    if group >= k:
        return 64
    return next(b for b in (128, 64, 32, 16) if group % b == 0)


@triton.jit
def _run_dot(x_ptr, w_ptr, s_ptr, z_ptr, p_ptr, rows, nmask, w0, offs_w, KW, end, G, BITS: tl.constexpr,
             GROUP: tl.constexpr, PERM: tl.constexpr):
    """[BLOCK_N, BLOCK_W]: the scaled sums (q - zero) x over the codes of the BLOCK_W words from
    w0 of rows `rows` (within one group: one scale and zero a row), words at `end` and after
    masked (KW: a row's words). Codes are taken in place, without a shift each:
    (word & (mask << sh)) | 2^23's bits is 2^23 + q 2^sh exactly for sh < 24 - BITS (the low
    half word's codes, then the high half's after one shift), so (that - 2^23) (x 2^-sh) is q x
    exactly; the zero comes off once a run, as zero * (the word's inputs' sum): one logic op, one
    subtraction and one FMA a code. Every operand has the words' [BLOCK_N, BLOCK_W] shape or a
    slice of it (a row's scale, a word's inputs), so no tile changes layout (a wider, multi-group
    tile made Triton convert the inputs' layout for every code: bound by shared memory, slower);
    a thread's inputs serve every row it holds."""
    PER: tl.constexpr = 32 // BITS
    HALF: tl.constexpr = PER // 2
    ws = w0 + offs_w
    wmask = ws < end
    words = tl.load(w_ptr + rows[:, None] * KW + ws[None, :], mask=nmask[:, None] & wmask[None, :], other=0)
    sz = rows * G + w0 * PER // GROUP  # (GROUP = K where one group spans the row: 0)
    gmask = nmask & (w0 < end)
    zr = tl.load(z_ptr + sz, mask=gmask, other=0).to(tl.float32)
    s = tl.load(s_ptr + sz, mask=gmask, other=0.0).to(tl.float32)
    part = tl.zeros(words.shape, dtype=tl.float32)
    xsum = tl.zeros(offs_w.shape, dtype=tl.float32)
    hi = words >> 16
    for i in tl.static_range(PER):
        sh = (i % HALF) * BITS  # constexpr (i is); Triton 3.6 refuses a re-annotated one
        src = words if i < HALF else hi
        ks = ws * PER + i
        if PERM:
            ks = tl.load(p_ptr + ks, mask=wmask, other=0)
        x = tl.load(x_ptr + ks, mask=wmask, other=0.0).to(tl.float32)
        xsum += x
        qf = ((src & (((1 << BITS) - 1) << sh)) | _MAGIC).to(tl.float32, bitcast=True)
        part += (qf - _MAGIC_F) * (x * (1.0 / (1 << sh)))[None, :]
    return (part - zr[:, None] * xsum[None, :]) * s[:, None]


@triton.jit
def _rows_dot(x_ptr, w_ptr, s_ptr, z_ptr, p_ptr, rows, nmask, KW, lo, hi, G, BITS: tl.constexpr,
              GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, RUNS: tl.constexpr,
              PERM: tl.constexpr):
    """sum_j W[rows, j] x[perm[j]] in fp32 [BLOCK_N] over the words [lo, hi) of each row, for one
    activation row at x_ptr: RUNS runs of BLOCK_W words an iteration, independent loads in flight
    together (a GEMV is bound by the loads a program keeps in flight)."""
    offs_w = tl.arange(0, BLOCK_W)
    acc = tl.zeros([BLOCK_N, BLOCK_W], dtype=tl.float32)
    for w0 in range(lo, hi, BLOCK_W * RUNS):
        for r in tl.static_range(RUNS):
            acc += _run_dot(x_ptr, w_ptr, s_ptr, z_ptr, p_ptr, rows, nmask, w0 + r * BLOCK_W, offs_w, KW, hi, G,
                            BITS, GROUP, PERM)
    return tl.sum(acc, axis=1)


@triton.jit
def _gemv_store(out_ptr, offs_n, nmask, res, up, GATED: tl.constexpr):
    """A GEMV row's output from its fp32 sums; GATED: silu(res) * up, rounded as HF rounds
    gate_proj, act_fn and the product."""
    dt = out_ptr.dtype.element_ty
    if GATED:
        g = res.to(dt).to(tl.float32)
        a = (g * tl.sigmoid(g)).to(dt).to(tl.float32)
        res = a * up.to(dt).to(tl.float32)
    tl.store(out_ptr + offs_n, res.to(dt), mask=nmask)


@triton.jit
def _wint_gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, p_ptr, out_ptr, part_ptr, cnt_ptr, N, KW, G, CHUNK, stride_x,
                      stride_out, M: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_W: tl.constexpr, RUNS: tl.constexpr, SPLIT: tl.constexpr, PERM: tl.constexpr,
                      GATED: tl.constexpr, PDL: tl.constexpr):
    """out[m, n] = sum_j W[n, j] x[m, perm[j]] for M (<= 4) rows; GATED: W is [2 N, K] (gate rows
    then up rows) and out = silu(gate) * up. Rows after the first re-read the program's words,
    from L2. Program (i, s) takes row block i's words [s CHUNK, (s + 1) CHUNK); SPLIT > 1: its
    sums go to part fp32 [SPLIT, M, 2, N] (gate, up), and the row block's last program (by
    cnt[i], int32, zero between launches: that program sets it back) adds them, s in order, so
    the result does not depend on which program ends last."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    rows = offs_n.to(tl.int64)
    split = tl.program_id(1)
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, KW)
    pdl_enter(PDL)
    for m in tl.static_range(M):
        res = _rows_dot(x_ptr + m * stride_x, w_ptr, s_ptr, z_ptr, p_ptr, rows, nmask, KW, lo, hi, G, BITS, GROUP,
                        BLOCK_N, BLOCK_W, RUNS, PERM)
        up = res
        if GATED:
            up = _rows_dot(x_ptr + m * stride_x, w_ptr, s_ptr, z_ptr, p_ptr, rows + N, nmask, KW, lo, hi, G, BITS,
                           GROUP, BLOCK_N, BLOCK_W, RUNS, PERM)
        if SPLIT == 1:
            _gemv_store(out_ptr + m * stride_out, offs_n, nmask, res, up, GATED)
        else:
            at = part_ptr + ((split * M + m) * 2) * N + offs_n
            tl.store(at, res, mask=nmask)
            if GATED:
                tl.store(at + N, up, mask=nmask)
    if SPLIT > 1:
        tl.debug_barrier()  # every thread's partials stored before the counter says so
        ended = tl.atomic_add(cnt_ptr + pid, 1)  # acq_rel at GPU scope
        if ended == SPLIT - 1:
            offs_s = tl.arange(0, SPLIT)
            for m in tl.static_range(M):
                parts = part_ptr + ((offs_s[:, None] * M + m) * 2) * N + offs_n[None, :]
                res = tl.sum(tl.load(parts, mask=nmask[None, :], other=0.0, cache_modifier=".cg"), axis=0)
                up = res
                if GATED:
                    up = tl.sum(tl.load(parts + N, mask=nmask[None, :], other=0.0, cache_modifier=".cg"), axis=0)
                _gemv_store(out_ptr + m * stride_out, offs_n, nmask, res, up, GATED)
            tl.atomic_xchg(cnt_ptr + pid, 0)


@triton.jit
def _wint_gemm_kernel(a_ptr, w_ptr, s_ptr, z_ptr, p_ptr, c_ptr, M, N, K, KW, G, stride_a, stride_c,
                      BITS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PERM: tl.constexpr, PDL: tl.constexpr):
    """c [M, N] = a [M, K] . W^T, W's K tiles (BLOCK_K within one group) unpacked and scaled into
    a's dtype. Programs walk GROUP_M row tiles per column tile (L2 reuse of the weight tile)."""
    PER: tl.constexpr = 32 // BITS
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_kw = tl.arange(0, BLOCK_K // PER)
    j = tl.arange(0, PER)
    mmask, nmask = offs_m < M, offs_n < N
    rows_a = offs_m.to(tl.int64)[:, None] * stride_a
    rows_w = offs_n.to(tl.int64)
    pdl_enter(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        kmask = ks < K
        ka = ks
        if PERM:
            ka = tl.load(p_ptr + ks, mask=kmask, other=0)
        a = tl.load(a_ptr + rows_a + ka[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        # [BLOCK_N, BLOCK_K / PER] words as stored (each read once, along K), unpacked to the
        # [BLOCK_N, BLOCK_K] codes in K order (word w's code i is input w PER + i)
        kw = k0 // PER + offs_kw
        words = tl.load(w_ptr + rows_w[:, None] * KW + kw[None, :], mask=nmask[:, None] & (kw < KW)[None, :], other=0)
        q = tl.reshape((words[:, :, None] >> (j * BITS)[None, None, :]) & ((1 << BITS) - 1), (BLOCK_N, BLOCK_K))
        qf = (q | _MAGIC).to(tl.float32, bitcast=True)
        g = k0 // GROUP
        z = tl.load(z_ptr + rows_w * G + g, mask=nmask, other=0).to(tl.float32) + _MAGIC_F
        s = tl.load(s_ptr + rows_w * G + g, mask=nmask, other=0.0).to(tl.float32)
        b = tl.trans(((qf - z[:, None]) * s[:, None]).to(a.dtype))
        acc = tl.dot(a, b, acc)
    c = c_ptr + offs_m.to(tl.int64)[:, None] * stride_c + offs_n[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _dequantize_kernel(w_ptr, s_ptr, z_ptr, p_ptr, out_ptr, N, K, KW, G, BITS: tl.constexpr, GROUP: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PERM: tl.constexpr):
    """out [N, K] = W in out's dtype, in input order (column j to input perm[j])."""
    PER: tl.constexpr = 32 // BITS
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows < N)[:, None] & (ks < K)[None, :]
    kw = tl.program_id(1) * (BLOCK_K // PER) + tl.arange(0, BLOCK_K // PER)  # each word read once
    words = tl.load(w_ptr + rows[:, None] * KW + kw[None, :], mask=(rows < N)[:, None] & (kw < KW)[None, :], other=0)
    q = tl.reshape((words[:, :, None] >> (tl.arange(0, PER) * BITS)[None, None, :]) & ((1 << BITS) - 1),
                   (BLOCK_N, BLOCK_K))
    sz = rows[:, None] * G + (ks // GROUP)[None, :]
    z = tl.load(z_ptr + sz, mask=mask, other=0)
    s = tl.load(s_ptr + sz, mask=mask, other=0.0).to(tl.float32)
    cols = ks
    if PERM:
        cols = tl.load(p_ptr + ks, mask=ks < K, other=0)
    w = (q - z).to(tl.float32) * s
    tl.store(out_ptr + rows[:, None] * K + cols[None, :], w.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize(w: IntLinear, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] in `dtype` (each value (q - zero) * scale, one rounding), in input order."""
    n, k = w.shape
    out = torch.empty((n, k), dtype=dtype, device=w.qweight.device)
    perm = w.perm if w.perm is not None else w.qweight
    _dequantize_kernel[(triton.cdiv(n, 32), triton.cdiv(k, 128))](
        w.qweight, w.scale, w.zero, perm, out, n, k, w.qweight.shape[1], w.scale.shape[1], BITS=w.bits,
        GROUP=min(w.group, k), BLOCK_N=32, BLOCK_K=128, PERM=w.perm is not None)
    return out


def gemv_config(n: int, w: IntLinear):
    """(BLOCK_N, BLOCK_W, RUNS, num_warps, SPLIT) for the GEMV over w's [n, K] rows: runs of BLOCK_W
    words within one group (the largest power of two up to 16 dividing a group's words), one run
    an iteration, 64 rows a program over 2 warps (a thread's inputs serve 16 rows at BLOCK_W 16),
    and each row's words split until the GEMV has GEMV_PROGRAMS_PER_SM programs an SM or a range
    would be under GEMV_MIN_RUNS runs: a 4-bit GEMV's rows are too few and too long to keep the
    memory busy one program each. From an H100 sweep over Qwen3-8B's projections at group 128
    (`bench_wint --sweep gemv`, docs/benchmarks.md); other groups keep the tile, unmeasured."""
    per = 32 // w.bits
    block_w = 16
    if w.group < w.k:
        words = w.group // per  # supports(): a group is whole words, 2 or more (group % 16 == 0)
        block_w = min(block_w, words & -words)
    programs = triton.cdiv(n, GEMV_BLOCK_N)
    kw = w.qweight.shape[1]
    split = 1
    while (split < GEMV_MAX_SPLIT and programs * split < GEMV_PROGRAMS_PER_SM * num_sms(w.qweight.device)
           and kw >= 2 * split * GEMV_MIN_RUNS * block_w):
        split *= 2
    return GEMV_BLOCK_N, block_w, 1, 2, split


# Split GEMVs' counters, one per row block, per device: zero between launches (the kernel that
# counts to SPLIT sets its counter back), so made once, outside any graph capture. Launches that
# share them run one at a time (one stream: a step's projections, eager or replayed).
_COUNTERS = {}
_MAX_ROW_BLOCKS = 1 << 16


def _split_counters(device: torch.device, row_blocks: int) -> Optional[torch.Tensor]:
    """The device's counters, None where they cannot be made now (first asked for during a graph
    capture, where the zeroing would only be recorded): the GEMV then runs unsplit."""
    key = (device.type, device.index)
    if key not in _COUNTERS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        _COUNTERS[key] = torch.zeros(_MAX_ROW_BLOCKS, dtype=torch.int32, device=device)
    return _COUNTERS[key] if row_blocks <= _MAX_ROW_BLOCKS else None


def gemm_config(m: int) -> dict:
    """Tiles per row count, from `bench_wint --sweep gemm` over Qwen3-8B's projections on the H200
    (16 and 256 rows; docs/benchmarks.md): 8 warps over 64-column tiles."""
    if m <= 32:
        return dict(BLOCK_M=16, BLOCK_N=64, GROUP_M=8, num_warps=8, num_stages=3)
    return dict(BLOCK_M=64 if m <= 64 else 128, BLOCK_N=64, GROUP_M=8, num_warps=8, num_stages=3)


def gemv(x: torch.Tensor, w: IntLinear, out: Optional[torch.Tensor] = None, gated: bool = False,
         config=None) -> torch.Tensor:
    """x [M <= GEMV_MAX_ROWS, K] (unit stride along K) -> [M, N] (gated: [M, N / 2]); config:
    gemv_config's tuple (SPLIT, a power of two, may be left out: 1), for benchmarks."""
    m = x.shape[0]
    n = w.qweight.shape[0] // (2 if gated else 1)
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_n, block_w, runs, warps, *rest = config or gemv_config(n, w)
    split = rest[0] if rest else 1
    if w.group < w.k and (w.group * w.bits // 32) % block_w:
        raise ValueError(f"a GEMV run of {block_w} words spans groups of {w.group} inputs ({w.bits} bits)")
    if split & (split - 1):
        raise ValueError(f"a GEMV's SPLIT must be a power of two, got {split}")
    kw = w.qweight.shape[1]
    row_blocks = triton.cdiv(n, block_n)
    counters = _split_counters(x.device, row_blocks) if split > 1 else None
    split = split if counters is not None else 1
    chunk = triton.cdiv(triton.cdiv(kw, split), block_w) * block_w  # runs start on group boundaries
    part = torch.empty((split, m, 2, n), dtype=torch.float32, device=x.device) if split > 1 else out
    perm = w.perm if w.perm is not None else w.qweight
    _wint_gemv_kernel[(row_blocks, split)](
        x, w.qweight, w.scale, w.zero, perm, out, part, counters if counters is not None else out, n, kw,
        w.scale.shape[1], chunk, x.stride(0), out.stride(0), M=m, BITS=w.bits, GROUP=min(w.group, w.k),
        BLOCK_N=block_n, BLOCK_W=block_w, RUNS=runs, SPLIT=split, PERM=w.perm is not None, GATED=gated,
        num_warps=warps, **launch_options())
    return out


def gemm(x: torch.Tensor, w: IntLinear, out: Optional[torch.Tensor] = None, config=None) -> torch.Tensor:
    """x [M, K] (unit stride along K) -> [M, N]; config: gemm_config's dict, for benchmarks."""
    m, k = x.shape
    n = w.qweight.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    cfg = dict(config or gemm_config(m))
    block_k = _gemm_block_k(w.group, k)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    perm = w.perm if w.perm is not None else w.qweight
    _wint_gemm_kernel[grid](x, w.qweight, w.scale, w.zero, perm, out, m, n, k, w.qweight.shape[1], w.scale.shape[1],
                            x.stride(0), out.stride(0), BITS=w.bits, GROUP=min(w.group, k),
                            BLOCK_K=block_k, PERM=w.perm is not None, **cfg, **launch_options())
    return out


# Rows from which a projection widens its weight to the activations' dtype (dequantize: the codes
# read and a transient [N, K] written once a call) and multiplies on cuBLAS. On the H200, over
# Qwen3-8B's projections: the fused GEMM (gemm_config's tiles) wins at 16 rows, the two tie at
# 256, and widening wins 2.5x at 1024 (docs/benchmarks.md). The same values either way: W
# rounded once to x's dtype, fp32 sums.
DEQUANT_MIN_ROWS = 256


def _matmul(x: torch.Tensor, w: IntLinear, out: Optional[torch.Tensor]) -> torch.Tensor:
    """x [M > GEMV_MAX_ROWS, K] -> x W^T [M, N]: the fused GEMM, or cuBLAS on the widened weight."""
    if x.shape[0] < DEQUANT_MIN_ROWS:
        return gemm(x, w, out)
    if out is None:
        out = torch.empty((x.shape[0], w.qweight.shape[0]), dtype=x.dtype, device=x.device)
    return torch.mm(x, dequantize(w, x.dtype).t(), out=out)


def wint_linear(x: torch.Tensor, w: IntLinear, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] (bf16 / fp16) -> x W^T [M, N] in x's dtype, into `out` when given (contiguous)."""
    if x.stride(1) != 1:
        x = x.contiguous()
    if 0 < x.shape[0] <= GEMV_MAX_ROWS:
        return gemv(x, w, out)
    return _matmul(x, w, out)


def wint_gate_up_silu(x: torch.Tensor, w: IntLinear, silu_and_mul) -> torch.Tensor:
    """silu(x gate^T) * (x up^T) for a fused [2 I, K] gate_up (gate rows then up rows): the
    GEMV's epilogue at small batch, else the projection then silu_and_mul."""
    if x.stride(1) != 1:
        x = x.contiguous()
    if 0 < x.shape[0] <= GEMV_MAX_ROWS:
        return gemv(x, w, gated=True)
    return silu_and_mul(_matmul(x, w, None))
