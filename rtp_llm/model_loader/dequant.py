"""Exact dequantization of quantized HF checkpoint weights, one linear layer at a time.

read_linear() finds the tensors a module is stored as and returns its weight as HF lays it out,
[N, K] (out, in), in fp32. Each value is exact: an integer code minus its zero point (exact in
int32) times its fp16/bf16/fp32 scale, or an e4m3 value times its scale, as one fp32 product
(at most 4 + 24 significant bits: correctly rounded, so any correct implementation gives the
same bits). The caller rounds that to the run dtype once. An FP8, GPTQ or AWQ weight may instead
stay as stored (read_linear's `keep`: an Fp8Tensor, fp8_weight.py, or a GroupIntTensor,
int_weight.py) for a backend with kernels for it, which widens nothing; every other backend
widens it with the same product (docs/engine.md).

What decides a module's format is what the checkpoint stores for it, read against the
QuantConfig: `<m>.qweight` (GPTQ/AWQ), an e4m3 `<m>.weight` with its scale, or a plain float
`<m>.weight`. Published checkpoints leave modules unquantized without listing them (lm_head,
a MoE router), so a plain float weight is loaded as it is; a module the config lists as not
converted must be plain; anything else that does not fit (scales beside a float weight, an
integer weight, packed tensors under a config of another method) is a CheckpointError."""

from typing import Dict, NamedTuple, Optional, Protocol, Tuple, Union

import torch

from rtp_llm.model_loader.fp8_weight import Fp8Tensor
from rtp_llm.model_loader.int_weight import GroupIntTensor, from_codes, from_words
from rtp_llm.model_loader.quant_config import AWQ, FP8, GPTQ, QuantConfig
from rtp_llm.model_loader.weights import CheckpointError

PACKED_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")  # GPTQ / AWQ tensors of a module, besides bias
FP8_SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale")
# AWQ packs the 8 nibbles of an int32 (low bits first) with columns [0, 2, 4, 6, 1, 3, 5, 7] of
# each 8; nibble position AWQ_UNPACK[j] holds column j (AutoAWQ's AWQ_REVERSE_ORDER).
AWQ_UNPACK = (0, 4, 1, 5, 2, 6, 3, 7)


class Tensors(Protocol):
    """A checkpoint's tensors by name (hf_loader's shard index)."""

    def __contains__(self, name: str) -> bool: ...

    def get(self, name: str) -> torch.Tensor: ...


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _check(t: torch.Tensor, name: str, shape: Tuple[int, ...], dtypes, why: str) -> None:
    if tuple(t.shape) != tuple(shape) or t.dtype not in dtypes:
        want = "/".join(str(d).replace("torch.", "") for d in dtypes)
        raise CheckpointError(f"tensor {name} is {str(t.dtype).replace('torch.', '')} {tuple(t.shape)}, expected "
                              f"{want} {tuple(shape)} ({why})")


def fp8_weight(weight: torch.Tensor, scale: torch.Tensor, qc: QuantConfig, name: str,
               dtype: torch.dtype = torch.float32) -> Fp8Tensor:
    """weight (e4m3 [N, K]) with its scale spread over it: one value, one per row ([N, 1]), or
    one per bn x bk block ([ceil(N / bn), ceil(K / bk)]; the last row and column of blocks may
    be partial), as an Fp8Tensor that dequantizes to `dtype`. `name`: the scale tensor's, for errors."""
    n, k = weight.shape
    s = scale.float()  # fp32, bf16 and e8m0 scales widen exactly
    if qc.fp8_scale == "tensor":
        if s.numel() != 1:
            raise CheckpointError(f"tensor {name} has shape {tuple(s.shape)}: a per-tensor scale (no "
                                  f"quantization_config.weight_block_size, {qc.quant_method}) must be one value")
        return Fp8Tensor.per_row(weight, s, dtype)
    if qc.fp8_scale == "channel":
        if tuple(s.shape) not in ((n, 1), (n,)):
            raise CheckpointError(f"tensor {name} has shape {tuple(s.shape)}: a per-channel scale "
                                  f"({qc.quant_method}) of a weight of {n} rows is ({n}, 1)")
        return Fp8Tensor.per_row(weight, s, dtype)
    bn, bk = qc.block
    if tuple(s.shape) != (_ceil(n, bn), _ceil(k, bk)):
        raise CheckpointError(f"tensor {name} has shape {tuple(s.shape)}, but quantization_config.{qc.block_field} "
                              f"= [{bn}, {bk}] over its weight {n} x {k} gives ({_ceil(n, bn)}, {_ceil(k, bk)})")
    return Fp8Tensor(weight, (n, k), dtype, s.contiguous(), (bn, bk))


def dequant_fp8(weight: torch.Tensor, scale: torch.Tensor, qc: QuantConfig, name: str) -> torch.Tensor:
    """W = weight times its scale (fp8_weight), in fp32."""
    return fp8_weight(weight, scale, qc, name).dequantize()


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words of 32 / bits codes each, low bits first, unpacked along `dim` (0: rows,
    1: columns) as int32 values in [0, 2^bits)."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    if dim == 0:
        codes = packed.unsqueeze(1) >> shifts.view(1, per, 1)  # [R, per, C]
    else:
        codes = packed.unsqueeze(2) >> shifts.view(1, 1, per)  # [R, C, per]
    rows, cols = packed.shape
    shape = (rows * per, cols) if dim == 0 else (rows, cols * per)
    return (codes & ((1 << bits) - 1)).reshape(shape)


def _groups(qc: QuantConfig, k: int) -> int:
    return 1 if qc.group_size == -1 else _ceil(k, qc.group_size)


class Codes(NamedTuple):
    """A GPTQ / AWQ weight unpacked, in the formats' [K, N] orientation: codes [K, N] and zeros
    [G, N] int32 (zeros as computed with), scales [G, N] as stored, group_of_k int64 [K]."""

    codes: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    group_of_k: torch.Tensor


def _gptq_groups(t: Dict[str, torch.Tensor], qc: QuantConfig, module: str, n: int, k: int) -> torch.Tensor:
    """Checks a GPTQ weight's tensors (gptq_codes says what they are); returns its g_idx (int64 [K])."""
    per, g = 32 // qc.bits, _groups(qc, k)
    if k % per or n % per:
        raise CheckpointError(f"{module}: a {qc.bits}-bit GPTQ weight of {n} x {k} needs N and K multiples of {per}")
    why = f"{qc.describe()} over a weight of {n} x {k}"
    _check(t["qweight"], f"{module}.qweight", (k // per, n), (torch.int32,), why)
    _check(t["qzeros"], f"{module}.qzeros", (g, n // per), (torch.int32,), why)
    _check(t["scales"], f"{module}.scales", (g, n), (torch.float16, torch.bfloat16, torch.float32), why)
    g_idx = t.get("g_idx")
    if g_idx is None:
        if qc.desc_act:
            raise CheckpointError(f"{module}: quantization_config.desc_act is true but {module}.g_idx is missing")
        return torch.arange(k) // _group_size(qc, k)
    _check(g_idx, f"{module}.g_idx", (k,), (torch.int32, torch.int64), why)
    g_idx = g_idx.long()
    if int(g_idx.min()) < 0 or int(g_idx.max()) >= g:
        raise CheckpointError(f"tensor {module}.g_idx holds groups outside [0, {g}) ({why})")
    return g_idx


def gptq_codes(t: Dict[str, torch.Tensor], qc: QuantConfig, module: str, n: int, k: int) -> Codes:
    """GPTQ (AutoGPTQ / GPTQModel): qweight int32 [K * bits / 32, N] (codes along K, low bits
    first), qzeros int32 [G, N * bits / 32] (along N), scales [G, N], g_idx int [K] (the group
    of each input channel: shuffled under desc_act; k // group_size otherwise and when absent).
    W[n, k] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n], z the stored zero plus zero_offset
    (v1's zero - 1 convention; 15 + 1 = 16 as AutoGPTQ's kernels read it)."""
    g_idx = _gptq_groups(t, qc, module, n, k)
    q = unpack_int32(t["qweight"], qc.bits, 0)                          # [K, N]
    z = unpack_int32(t["qzeros"], qc.bits, 1) + qc.zero_offset          # [G, N]
    return Codes(q, z, t["scales"], g_idx)


def _gptq_in_order(t: Dict[str, torch.Tensor], qc: QuantConfig, module: str, n: int, k: int,
                   dtype: torch.dtype) -> Optional[GroupIntTensor]:
    """A GPTQ weight whose groups are in input order kept packed without unpacking its codes (its
    qweight transposed is the row layout already); None where desc_act shuffled its groups."""
    g_idx = _gptq_groups(t, qc, module, n, k)
    size = _group_size(qc, k)
    if not torch.equal(g_idx, torch.arange(k) // size):
        return None
    z = unpack_int32(t["qzeros"], qc.bits, 1) + qc.zero_offset
    return from_words(t["qweight"].t(), k, z, t["scales"], size, qc.bits, dtype)


def awq_codes(t: Dict[str, torch.Tensor], qc: QuantConfig, module: str, n: int, k: int) -> Codes:
    """AWQ GEMM (AutoAWQ): qweight int32 [K, N / 8] and qzeros int32 [G, N / 8], 8 nibbles a
    word in AWQ's interleaved column order, scales [G, N]; group of input k: k // group_size.
    W[n, k] = (q[k, n] - z[k // group_size, n]) * s[k // group_size, n]."""
    g = _groups(qc, k)
    if n % 8:
        raise CheckpointError(f"{module}: a 4-bit AWQ weight of {n} x {k} needs N a multiple of 8")
    why = f"{qc.describe()} over a weight of {n} x {k}"
    _check(t["qweight"], f"{module}.qweight", (k, n // 8), (torch.int32,), why)
    _check(t["qzeros"], f"{module}.qzeros", (g, n // 8), (torch.int32,), why)
    _check(t["scales"], f"{module}.scales", (g, n), (torch.float16, torch.bfloat16, torch.float32), why)
    order = torch.tensor(AWQ_UNPACK)

    def columns(packed):  # [R, N / 8] words -> [R, N] codes in column order
        return unpack_int32(packed, 4, 1).unflatten(1, (-1, 8))[:, :, order].flatten(1)

    return Codes(columns(t["qweight"]), columns(t["qzeros"]), t["scales"], torch.arange(k) // _group_size(qc, k))


def dequant_codes(c: Codes) -> torch.Tensor:
    """W [N, K] = (q - z) * s, gathered by each input's group, in fp32."""
    return ((c.codes - c.zeros[c.group_of_k]).float() * c.scales.float()[c.group_of_k]).t().contiguous()


def _group_size(qc: QuantConfig, k: int) -> int:
    return k if qc.group_size == -1 else qc.group_size


def _refuse_skipped(qc: QuantConfig, module: str, stored: str) -> None:
    if qc.skips(module):
        raise CheckpointError(f"{module} is stored {stored}, but quantization_config.{qc.skip_field} lists it "
                              f"as not quantized")


def _packed(tensors: Tensors, qc: Optional[QuantConfig], module: str, n: int, k: int,
            keep: Optional[torch.dtype]) -> Union[torch.Tensor, GroupIntTensor]:
    if qc is None or qc.kind not in (GPTQ, AWQ):
        method = qc.quant_method if qc else "absent"
        raise CheckpointError(f"tensor {module}.qweight is a packed integer weight (GPTQ/AWQ), but "
                              f"quantization_config.quant_method is {method}")
    _refuse_skipped(qc, module, "packed (qweight)")
    needed = PACKED_SUFFIXES[:3] if qc.kind == AWQ else PACKED_SUFFIXES
    parts = {s: tensors.get(f"{module}.{s}") for s in needed if f"{module}.{s}" in tensors}
    missing = [s for s in PACKED_SUFFIXES[:3] if s not in parts]
    if missing:
        raise CheckpointError(f"missing tensor {module}.{missing[0]} beside {module}.qweight ({qc.describe()})")
    if keep and qc.kind == GPTQ:
        kept = _gptq_in_order(parts, qc, module, n, k, keep)
        if kept is not None:
            return kept
    c = (gptq_codes if qc.kind == GPTQ else awq_codes)(parts, qc, module, n, k)
    kept = from_codes(c.codes, c.zeros, c.scales, c.group_of_k, _group_size(qc, k), qc.bits, keep) if keep else None
    return kept if kept is not None else dequant_codes(c)


def read_linear(tensors: Tensors, qc: Optional[QuantConfig], module: str, shape: Tuple[int, int],
                keep: Optional[torch.dtype] = None) -> Optional[Union[torch.Tensor, Fp8Tensor, GroupIntTensor]]:
    """The weight of linear module `module` (expected `shape` [N, K]) as stored: dequantized to
    fp32 when quantized, as stored when plain; None when the checkpoint has neither form. With
    `keep` (a run dtype), an FP8 weight stays an Fp8Tensor and a GPTQ / AWQ one a GroupIntTensor
    (where its groups allow) that dequantizes to it."""
    name = module + ".weight"
    if f"{module}.qweight" in tensors:
        if name in tensors:
            raise CheckpointError(f"{module} is stored twice: {name} and {module}.qweight")
        return _packed(tensors, qc, module, *shape, keep)
    if name not in tensors:
        return None
    w = tensors.get(name)
    scales = [s for s in FP8_SCALE_SUFFIXES if f"{module}.{s}" in tensors]
    if w.dtype == torch.float8_e4m3fn:
        if qc is None or qc.kind != FP8:
            method = qc.quant_method if qc else "absent"
            raise CheckpointError(f"tensor {name} is float8_e4m3fn, but quantization_config.quant_method is {method}")
        _refuse_skipped(qc, module, "as float8_e4m3fn")
        found = [s for s in qc.scale_names if s in scales]
        if len(found) != 1:
            what = "no" if not found else "two"
            raise CheckpointError(f"tensor {name} is float8_e4m3fn with {what} scale tensor "
                                  f"({' or '.join(f'{module}.{s}' for s in qc.scale_names)}; {qc.describe()})")
        if tuple(w.shape) != tuple(shape):
            return w  # check_weights names the shape at fault
        kept = fp8_weight(w, tensors.get(f"{module}.{found[0]}"), qc, f"{module}.{found[0]}", keep or torch.float32)
        return kept if keep else kept.dequantize()
    if scales:
        raise CheckpointError(f"tensor {name} is {str(w.dtype).replace('torch.', '')} beside a scale "
                              f"({module}.{scales[0]}): only float8_e4m3fn weights are scaled")
    return check_plain(name, w, qc)


def check_plain(name: str, t: torch.Tensor, qc: Optional[QuantConfig]) -> torch.Tensor:
    """t, a tensor read as it is (then cast to the run dtype): refused unless it is a 16- or
    32-bit float, since an integer or 8-bit float tensor without its scales is not its values."""
    if not t.dtype.is_floating_point or t.dtype.itemsize < 2:
        raise CheckpointError(f"tensor {name} is {str(t.dtype).replace('torch.', '')}: a quantized tensor this "
                              f"loader does not read (quantization_config: {qc.describe() if qc else 'absent'})")
    return t
