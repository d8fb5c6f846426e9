"""The routed experts of a MoE MLP (DeviceBackend.moe) in Triton: the (token, expert) pairs
grouped by expert without a host sync, then one grouped GEMM per projection over the groups.
Every shape depends only on the token count, so a step with it is captured in CUDA graphs.

Shapes: T tokens, K = top-k, P = T K pairs (pair p = t K + k), E experts, H hidden, I this
rank's intermediate slice. A launch (moe()):

  1. _count_kernel: each pair takes a place in its expert's list: rank[p] = atomic_add(count[e], 1).
     The order within an expert is arbitrary, and harmless: a row of a tile's product does not
     depend on the rows beside it.
  2. _layout_kernel (one program): each expert's list padded to BLOCK_M rows, laid out in
     expert order: starts[e]; block_expert[b] for each block of BLOCK_M rows (-1 past the end),
     and every row set to P (no pair) before step 3 fills the real ones.
  3. _place_kernel: rows[starts[e] + rank[p]] = p.
  4. _expert_gemm_kernel, twice: a program takes one block of rows (one expert) and one tile of
     output columns. First over gate_up with silu(gate) * up in the epilogue (x's rows by
     token -> [P, I]), then over down with each row times its routing weight (-> [P, H]).
  5. The sum over k of [T, K, H] (torch: fp32 accumulation, rounded once).

Rounding (the contract with device/base.py's moe_reference): gate and up rounded to x's dtype,
silu(gate) rounded, their product rounded; the down projection rounded, then times the routing
weight, rounded; the K rows summed in fp32, rounded once. Only the GEMMs' summation order
differs from the reference's, and in fp32 the products are exact IEEE ones (no TF32).

Row buffer: P + min(E, P) (BLOCK_M - 1) rows at most (each expert that has a pair pads at most
BLOCK_M - 1 rows)."""

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from rtp_llm.device.cuda.kernels.attention import _dot_precision, _pow2
from rtp_llm.device.cuda.kernels.moe_tuned import Key, tuned_table


@dataclass(frozen=True)
class MoeGemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int      # row blocks whose column tiles run together (L2 reuse of their rows)
    num_warps: int
    num_stages: int

    def shared_bytes(self, elem: int) -> int:
        """Shared memory the gated GEMM's pipeline holds: a rows tile and two weight tiles a stage."""
        return self.num_stages * (self.block_m * self.block_k + 2 * self.block_k * self.block_n) * elem


def moe_config(tokens: int, top_k: int, experts: int, key: Optional[Key] = None) -> MoeGemmConfig:
    """The tiles for T tokens routed to K of E experts: the tuned entry of the nearest token count
    where moe_tuned has the layer's key, else by the rows an active expert gets on average, as
    the H200's sweeps chose: few (decode) -> 16-row blocks and narrow column tiles, so that
    enough programs stream the experts' weights; many (prompts) -> large tiles that reuse each
    weight tile across rows."""
    table = tuned_table(key) if key is not None else None
    if table:
        return MoeGemmConfig(*table[min(table, key=lambda t: abs(t - tokens))])
    pairs = tokens * top_k
    rows = pairs / max(1, min(experts, pairs))
    if rows <= 16:
        return MoeGemmConfig(16, 32, 128, 1, 4, 4)
    if rows <= 64:
        return MoeGemmConfig(32, 64, 128, 1, 4, 3)
    return MoeGemmConfig(128, 128, 64, 1, 8, 3)


def fit_shared_memory(cfg: MoeGemmConfig, elem: int, limit: Optional[int]) -> MoeGemmConfig:
    """cfg with fewer stages, then shorter K and N tiles, until its pipeline fits `limit` bytes
    of shared memory (None: no limit; GPUs with less than an H200's 227 KiB an SM)."""
    while limit is not None and cfg.shared_bytes(elem) > limit:
        if cfg.num_stages > 2:
            cfg = dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.block_k > 32:
            cfg = dataclasses.replace(cfg, block_k=cfg.block_k // 2)
        elif cfg.block_n > 32:
            cfg = dataclasses.replace(cfg, block_n=cfg.block_n // 2)
        else:
            break
    return cfg


@functools.lru_cache(maxsize=None)
def _shared_memory_limit(device: torch.device) -> Optional[int]:
    """Bytes of shared memory a program may take on `device`, less a margin for what the pipeline
    estimate leaves out (epilogue layouts); None off CUDA (Triton's interpreter)."""
    if device.type != "cuda":
        return None
    props = triton.runtime.driver.active.utils.get_device_properties(device.index or 0)
    return props["max_shared_mem"] - 8 * 1024


@functools.lru_cache(maxsize=None)
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def layer_key(device: torch.device, dtype: torch.dtype, experts: int, inter: int, hidden: int, top_k: int) -> Key:
    """moe_tuned's key of a layer: the device's name and the experts' shape."""
    return (_device_name(device), experts, inter, hidden, top_k, str(dtype).replace("torch.", ""))


@functools.lru_cache(maxsize=None)
def _launch_config(tokens: int, top_k: int, experts: int, inter: int, hidden: int, dtype: torch.dtype,
                   device: torch.device) -> MoeGemmConfig:
    """moe()'s tiles for a step's shape, resolved once per shape (every MoE layer of a step asks):
    moe_config's, fp32's own small ones, fitted to the device's shared memory."""
    cfg = moe_config(tokens, top_k, experts, layer_key(device, dtype, experts, inter, hidden, top_k))
    if dtype == torch.float32:
        # The parity path: 4-byte tiles in 2 stages (the bf16 tiles' stages would not fit in
        # shared memory); its speed does not matter.
        cfg = MoeGemmConfig(cfg.block_m, min(cfg.block_n, 64), 32, cfg.group_m, 4, 2)
    return fit_shared_memory(cfg, dtype.itemsize, _shared_memory_limit(device))


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, rank_ptr, P, E, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < P
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    m &= (e >= 0) & (e < E)  # (never otherwise: no id can make it write outside the counts)
    r = tl.atomic_add(counts_ptr + e, 1, mask=m)
    tl.store(rank_ptr + offs, r, mask=m)


@triton.jit
def _layout_kernel(counts_ptr, starts_ptr, block_expert_ptr, rows_ptr, E, P, NUM_ROWS,
                   BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, BLOCK: tl.constexpr, BLOCK_B: tl.constexpr):
    e = tl.arange(0, E_POW2)
    em = e < E
    c = tl.load(counts_ptr + e, mask=em, other=0)
    padded = (c + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    tl.store(starts_ptr + e, ends - padded, mask=em)
    ends = tl.where(em, ends, NUM_ROWS + 1)  # (lanes past E end after every block)
    for r0 in range(0, NUM_ROWS, BLOCK):
        r = r0 + tl.arange(0, BLOCK)
        tl.store(rows_ptr + r, tl.full([BLOCK], P, tl.int32), mask=r < NUM_ROWS)
    num_blocks = NUM_ROWS // BLOCK_M
    for b0 in range(0, num_blocks, BLOCK_B):
        b = b0 + tl.arange(0, BLOCK_B)
        # A block belongs to the first expert whose padded list ends after its first row.
        before = tl.sum((ends[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.where(before < E, before, -1), mask=b < num_blocks)


@triton.jit
def _place_kernel(ids_ptr, rank_ptr, starts_ptr, rows_ptr, P, E, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < P
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    m &= (e >= 0) & (e < E)
    dest = tl.load(starts_ptr + e, mask=m, other=0) + tl.load(rank_ptr + offs, mask=m, other=0)
    tl.store(rows_ptr + dest, offs.to(tl.int32), mask=m)


@triton.jit
def _expert_gemm_kernel(a_ptr, w_ptr, out_ptr, rows_ptr, block_expert_ptr, weights_ptr, N, KDIM, P,
                        stride_a, stride_we, stride_wn, stride_out, up_offset, NUM_BLOCKS, TOP_K: tl.constexpr,
                        A_BY_TOKEN: tl.constexpr, GATED: tl.constexpr, WEIGHTED: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        PREC: tl.constexpr):
    """out[p, n] for the rows p of one block of rows (one expert's) and the columns of one
    tile: a's row (p // TOP_K when A_BY_TOKEN, else p) times expert e's weight [N (2 N when
    GATED: up rows from up_offset = N stride_wn), KDIM] transposed. Programs walk every column
    tile of GROUP_M row blocks before the next group, so a block's rows are read from L2 once
    they were read for its first tile."""
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * tiles_n
    first = pid // group * GROUP_M
    size = min(NUM_BLOCKS - first, GROUP_M)
    block = first + (pid % group) % size
    tile = (pid % group) // size
    e = tl.load(block_expert_ptr + block)
    if e < 0:
        return
    rows = tl.load(rows_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    rmask = rows < P
    a_rows = rows // TOP_K if A_BY_TOKEN else rows
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_a + offs_k[None, :]
    # The weight tile as [BLOCK_K, BLOCK_N]: W^T of HF's [out, in] rows.
    w_ptrs = w_ptr + e.to(tl.int64) * stride_we + offs_n.to(tl.int64)[None, :] * stride_wn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, KDIM, BLOCK_K):
        kmask = offs_k < KDIM - k0
        a = tl.load(a_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
        wmask = kmask[:, None] & nmask[None, :]
        acc = tl.dot(a, tl.load(w_ptrs, mask=wmask, other=0.0), acc, input_precision=PREC)
        if GATED:
            acc_u = tl.dot(a, tl.load(w_ptrs + up_offset, mask=wmask, other=0.0), acc_u, input_precision=PREC)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    dt = out_ptr.dtype.element_ty
    res = acc.to(dt).to(tl.float32)
    if GATED:
        act = (res * tl.sigmoid(res)).to(dt).to(tl.float32)
        res = act * acc_u.to(dt).to(tl.float32)
    if WEIGHTED:
        res *= tl.load(weights_ptr + rows, mask=rmask, other=0.0).to(tl.float32)[:, None]
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_out + offs_n[None, :]
    tl.store(out_ptrs, res.to(dt), mask=rmask[:, None] & nmask[None, :])


@triton.jit
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, E, stride_l, K: tl.constexpr, K_POW2: tl.constexpr,
                  E_POW2: tl.constexpr, NORM: tl.constexpr):
    """One token's routing (models_py/moe.py route()): softmax over the E logits in fp32, the K
    largest, each the first of equals, in descending order, renormalized to sum 1 when NORM.
    Invariant: every id is in [0, E) and a token's K ids are distinct, whatever the logits (a
    graph's padding rows hold garbage, NaN too): the keys order valid probabilities (>= 0) above
    NaN ones (-1), those above the ones taken (-2), those above the lanes past E (-3)."""
    t = tl.program_id(0)
    offs = tl.arange(0, E_POW2)
    m = offs < E
    x = tl.load(logits_ptr + t * stride_l + offs, mask=m, other=float("-inf")).to(tl.float32)
    ex = tl.where(m, tl.exp(x - tl.max(x, 0)), 0.0)
    p = ex / tl.sum(ex, 0)
    key = tl.where(m, tl.where(p == p, p, -1.0), -3.0)
    slots = tl.arange(0, K_POW2)
    vals = tl.zeros([K_POW2], tl.float32)
    ids = tl.zeros([K_POW2], tl.int64)
    for k in tl.static_range(K):
        best = tl.max(key, 0)
        idx = tl.minimum(tl.min(tl.where(key == best, offs, E_POW2), 0), E - 1)
        vals = tl.where(slots == k, tl.sum(tl.where(offs == idx, p, 0.0), 0), vals)
        ids = tl.where(slots == k, idx.to(tl.int64), ids)
        key = tl.where(offs == idx, -2.0, key)
    if NORM:
        vals = vals / tl.sum(vals, 0)
    km = slots < K
    tl.store(weights_ptr + t * K + slots, vals.to(weights_ptr.dtype.element_ty), mask=km)
    tl.store(ids_ptr + t * K + slots, ids, mask=km)


def route(router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool):
    """DeviceBackend.moe_route in one launch: router_logits [T, E] -> (weights [T, K] in the
    logits' dtype, ids [T, K] int64), models_py/moe.py route()'s contract."""
    t, e = router_logits.shape
    assert router_logits.stride(1) == 1
    weights = torch.empty(t, top_k, dtype=router_logits.dtype, device=router_logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int64, device=router_logits.device)
    if t:
        _route_kernel[(t,)](router_logits, weights, ids, e, router_logits.stride(0), K=top_k,
                            K_POW2=_pow2(top_k, 2), E_POW2=_pow2(e, 2),
                            NORM=norm_topk_prob)
    return weights, ids


def max_rows(pairs: int, experts: int, block_m: int) -> int:
    """The grouped rows' buffer length: every active expert pads at most block_m - 1 rows."""
    n = pairs + min(experts, pairs) * (block_m - 1)
    return -(-n // block_m) * block_m


def group_by_expert(topk_ids: torch.Tensor, experts: int, block_m: int):
    """(rows [R] int32: the pair in each row, P where none; block_expert [R / block_m] int32:
    each block's expert, -1 past the end), R = max_rows(P, E, block_m); topk_ids: [T, K]."""
    ids = topk_ids.reshape(-1)
    p = ids.numel()
    dev = ids.device
    n = max_rows(p, experts, block_m)
    counts = torch.zeros(experts, dtype=torch.int32, device=dev)
    rank = torch.empty(p, dtype=torch.int32, device=dev)
    starts = torch.empty(experts, dtype=torch.int32, device=dev)
    rows = torch.empty(n, dtype=torch.int32, device=dev)
    block_expert = torch.empty(n // block_m, dtype=torch.int32, device=dev)
    block = 1024
    grid = (triton.cdiv(p, block),)
    _count_kernel[grid](ids, counts, rank, p, experts, BLOCK=block)
    _layout_kernel[(1,)](counts, starts, block_expert, rows, experts, p, n, BLOCK_M=block_m,
                         E_POW2=triton.next_power_of_2(experts), BLOCK=block, BLOCK_B=32)
    _place_kernel[grid](ids, rank, starts, rows, p, experts, BLOCK=block)
    return rows, block_expert


def _gemm(a, w, out, rows, block_expert, weights, n: int, top_k: int, cfg: MoeGemmConfig, a_by_token: bool,
          gated: bool):
    """out [P, n] = _expert_gemm_kernel over a's rows and the experts' weights w [E, n (2 n), KDIM]."""
    prec = _dot_precision(a.dtype)
    blocks = block_expert.numel()
    grid = (blocks * triton.cdiv(n, cfg.block_n),)
    _expert_gemm_kernel[grid](a, w, out, rows, block_expert, rows if weights is None else weights, n, a.shape[1],
                              out.shape[0], a.stride(0), w.stride(0), w.stride(1), out.stride(0), n * w.stride(1),
                              blocks, TOP_K=top_k, A_BY_TOKEN=a_by_token, GATED=gated, WEIGHTED=weights is not None,
                              BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                              PREC=prec, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def moe(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
        topk_ids: torch.Tensor, config: MoeGemmConfig = None) -> torch.Tensor:
    """DeviceBackend.moe: x [T, H]; gate_up [E, 2 I, H]; down [E, H, I]; topk_weights [T, K] in
    x's dtype; topk_ids [T, K] int64 -> [T, H] in x's dtype."""
    t, k = topk_ids.shape
    e, two_i, h = gate_up.shape
    i = two_i // 2
    assert x.shape == (t, h) and down.shape == (e, h, i) and x.stride(1) == 1
    assert gate_up.is_contiguous() and down.is_contiguous() and topk_weights.is_contiguous()
    if t == 0:
        return torch.empty_like(x)
    if config is None:
        cfg = _launch_config(t, k, e, i, h, x.dtype, x.device)
    else:
        cfg = fit_shared_memory(config, x.element_size(), _shared_memory_limit(x.device))
    rows, block_expert = group_by_expert(topk_ids, e, cfg.block_m)
    act = torch.empty(t * k, i, dtype=x.dtype, device=x.device)   # [P, I]
    _gemm(x, gate_up, act, rows, block_expert, None, i, k, cfg, a_by_token=True, gated=True)
    out = torch.empty(t * k, h, dtype=x.dtype, device=x.device)   # [P, H], weighted
    _gemm(act, down, out, rows, block_expert, topk_weights, h, k, cfg, a_by_token=False, gated=False)
    return out.view(t, k, h).sum(dim=1)
