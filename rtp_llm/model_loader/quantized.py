"""Checkpoint tensors kept quantized as stored: a GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K
projection weight stays in the file's blocks (no bf16 copy) until a backend that computes on it
packs it (DeviceBackend.keeps_quantized / pack_linear); elsewhere it is widened at that point.
The formats' block sizes come from the gguf package (GGML_QUANT_SIZES), the one declaration on
this side; the CPU kernels declare theirs (and the blocks' layouts) in rtp_llm/cpp/ops/cpu/q8_0.h
and kquant.h."""

import re
import warnings
from dataclasses import dataclass
from typing import ClassVar, Optional, Sequence, Tuple, Type, Union

import numpy as np
import torch


# The projections whose weights may stay packed as a checkpoint stores them (FP8, GPTQ / AWQ) or be
# quantized at load (--quantization=fp8), for decoder.py to pack with DeviceBackend.pack_linear /
# pack_gate_up: attention's q/k/v/o and a dense MLP's; not a MoE layer's experts (stacked into float
# tensors) nor DeepSeek's latent projections (absorbed).
_PROJECTIONS = re.compile(r"\.self_attn\.[qkvo]_proj\.weight$|\.mlp\.(gate|up|down)_proj\.weight$")


def kept_projection(config, name: str) -> bool:
    """Whether weight `name` of the model `config` (a ModelConfig) is such a projection."""
    return config.mla is None and bool(_PROJECTIONS.search(name))


def _sizes(qtype_name: str) -> Tuple[int, int]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[qtype_name]]  # (weights per block, bytes per block)


@dataclass
class QuantizedTensor:
    """An HF-shaped [out, in] weight as GGUF blocks of one format (a subclass per format):
    `blocks` uint8 [out, in / block * block_bytes], each row its blocks in order (blocks never
    span rows). `dtype` is what dequantize() widens to (the run dtype)."""

    QTYPE: ClassVar[str] = ""  # the gguf GGMLQuantizationType name

    blocks: torch.Tensor
    shape: Tuple[int, int]
    dtype: torch.dtype

    @classmethod
    def from_gguf(cls, data: np.ndarray, shape: Sequence[int], dtype: torch.dtype,
                  copy: bool = True) -> "QuantizedTensor":
        """copy=False keeps `data` itself (a read-only view of the file: only for a tensor that
        is never written, whose reads touch few of its pages, like an embedding table)."""
        block, nbytes = _sizes(cls.QTYPE)
        out, inp = int(shape[0]), int(shape[1])
        if inp % block or data.shape != (out, inp // block * nbytes):
            raise ValueError(f"a {cls.QTYPE} tensor of shape {tuple(shape)} needs {inp // block * nbytes} bytes a row, "
                             f"got {data.shape}")
        if copy:
            return cls(torch.from_numpy(np.array(data, dtype=np.uint8)), (out, inp), dtype)  # a writable copy
        with warnings.catch_warnings():  # (torch warns that it cannot mark the tensor read-only)
            warnings.simplefilter("ignore", UserWarning)
            return cls(torch.from_numpy(data), (out, inp), dtype)

    @classmethod
    def block_size(cls) -> int:
        return _sizes(cls.QTYPE)[0]

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def rows(self, start: int, n: int) -> "QuantizedTensor":
        return type(self)(self.blocks[start:start + n], (n, self.shape[1]), self.dtype)

    def splits_rows_at(self, start: int, n: int) -> bool:
        """Whether rows(start, n) keeps whole blocks (GGUF blocks never span rows)."""
        return True

    def splits_cols_at(self, start: int, n: int) -> bool:
        """Whether cols(start, n) keeps whole blocks."""
        return start % self.block_size() == 0 and n % self.block_size() == 0

    def cols(self, start: int, n: int) -> "QuantizedTensor":
        block, nbytes = _sizes(self.QTYPE)
        if not self.splits_cols_at(start, n):
            raise ValueError(f"a {self.QTYPE} weight splits along its input only at multiples of {block}, "
                             f"not [{start}, {start + n})")
        b = self.blocks[:, start // block * nbytes:(start + n) // block * nbytes]
        return type(self)(b.contiguous(), (self.shape[0], n), self.dtype)

    @classmethod
    def cat(cls, parts: Sequence["QuantizedTensor"]) -> Optional["QuantizedTensor"]:
        """Parts of this format stacked along their rows (None: not expressible in it)."""
        return cls(torch.cat([p.blocks for p in parts]), (sum(p.shape[0] for p in parts), parts[0].shape[1]),
                   parts[0].dtype)

    def pad_rows(self, n: int) -> "QuantizedTensor":
        """n zero rows appended (all-zero blocks: every scale 0, so every weight 0)."""
        pad = self.blocks.new_zeros(n, self.blocks.shape[1])
        return type(self)(torch.cat([self.blocks, pad]), (self.shape[0] + n, self.shape[1]), self.dtype)

    def permute_rows(self, index: torch.Tensor) -> "QuantizedTensor":
        """Rows reordered: row i of the result is row index[i] (whole rows: blocks never span them)."""
        return type(self)(self.blocks[index].contiguous(), self.shape, self.dtype)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (int64 [T], on the CPU) widened to the run dtype: an embedding lookup that
        reads only those rows' blocks; the same values as dequantize()[ids]."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        w = dequantize(self.blocks[ids].numpy(), GGMLQuantizationType[self.QTYPE])
        return torch.from_numpy(np.array(w, dtype=np.float32).reshape(ids.shape[0], self.shape[1])).to(self.dtype)

    def dequantize(self) -> torch.Tensor:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        w = dequantize(self.blocks.numpy(), GGMLQuantizationType[self.QTYPE])
        return torch.from_numpy(np.array(w, dtype=np.float32).reshape(self.shape)).to(self.dtype)


class Q8_0Tensor(QuantizedTensor):
    """Q8_0: per 32 weights an fp16 scale, then 32 int8 (w = scale * q); 34 bytes."""

    QTYPE = "Q8_0"


class _NibbleTensor(QuantizedTensor):
    """The 4- and 5-bit formats of 32-weight blocks (layouts: rtp_llm/cpp/ops/cpu/q8_0.h): fp16 d,
    for _1 formats fp16 m, for Q5 formats a uint32 of 5th bits, then 16 bytes of nibbles (byte j:
    weight j low, j + 16 high). Formats without a min (w = d * (q - ZERO)) are Q8_0 blocks
    exactly (d, q - ZERO fits int8): to_q8_0()."""

    HAS_MIN: ClassVar[bool] = False
    HIGH_BITS: ClassVar[bool] = False
    ZERO: ClassVar[int] = 0

    def quants(self) -> np.ndarray:
        """uint8 [out, in / 32, 32]: each weight's unsigned quant (w = d * (q - ZERO) (+ m))."""
        block, nbytes = _sizes(self.QTYPE)
        b = self.blocks.numpy().reshape(self.shape[0], -1, nbytes)
        qs = b[..., nbytes - block // 2:]
        q = np.concatenate([qs & 0xF, qs >> 4], axis=-1)
        if self.HIGH_BITS:
            start = 4 if self.HAS_MIN else 2
            qh = np.ascontiguousarray(b[..., start:start + 4]).view("<u4")  # [out, nb, 1]
            q |= (((qh >> np.arange(block, dtype=np.uint32)) & 1) << 4).astype(np.uint8)
        return q

    def to_q8_0(self) -> "Q8_0Tensor":
        """The same weights as Q8_0 blocks (the file's d, q - ZERO as int8): exact."""
        if self.HAS_MIN:
            raise ValueError(f"{self.QTYPE} has a min per block: not expressible as Q8_0")
        _, nbytes = _sizes(self.QTYPE)
        d = self.blocks.numpy().reshape(self.shape[0], -1, nbytes)[..., :2]
        q = (self.quants().astype(np.int16) - self.ZERO).astype(np.int8).view(np.uint8)
        blocks = np.concatenate([d, q], axis=-1).reshape(self.shape[0], -1)
        return Q8_0Tensor(torch.from_numpy(blocks), self.shape, self.dtype)


class Q4_0Tensor(_NibbleTensor):
    """Q4_0: fp16 d, 16 bytes of nibbles (w = d * (q - 8)); 18 bytes per 32 weights."""

    QTYPE = "Q4_0"
    ZERO = 8


class Q4_1Tensor(_NibbleTensor):
    """Q4_1: fp16 d and m, 16 bytes of nibbles (w = d * q + m); 20 bytes per 32 weights."""

    QTYPE = "Q4_1"
    HAS_MIN = True


class Q5_0Tensor(_NibbleTensor):
    """Q5_0: fp16 d, 4 bytes of 5th bits, 16 of nibbles (w = d * (q - 16)); 22 bytes per 32."""

    QTYPE = "Q5_0"
    HIGH_BITS = True
    ZERO = 16


class Q5_1Tensor(_NibbleTensor):
    """Q5_1: fp16 d and m, 4 bytes of 5th bits, 16 of nibbles (w = d * q + m); 24 bytes per 32."""

    QTYPE = "Q5_1"
    HAS_MIN = True
    HIGH_BITS = True


class Q4_KTensor(QuantizedTensor):
    """Q4_K: per 256 weights fp16 d and dmin, 6-bit scales and mins of 8 sub-blocks, 4-bit q
    (w = d * sc * q - dmin * m); 144 bytes. Layout: rtp_llm/cpp/ops/cpu/kquant.h."""

    QTYPE = "Q4_K"


class Q5_KTensor(QuantizedTensor):
    """Q5_K: Q4_K with a 5th bit per weight (32 bytes of them; w = d * sc * q - dmin * m, q in
    [0, 31]); 176 bytes. Layout: rtp_llm/cpp/ops/cpu/kquant.h."""

    QTYPE = "Q5_K"


class Q6_KTensor(QuantizedTensor):
    """Q6_K: per 256 weights 6-bit q, int8 scales of 16 sub-blocks, fp16 d (w = d * sc * (q - 32));
    210 bytes. Layout: rtp_llm/cpp/ops/cpu/kquant.h."""

    QTYPE = "Q6_K"


# The formats a checkpoint tensor may stay in, by gguf type name.
KEPT_FORMATS = {cls.QTYPE: cls for cls in (Q8_0Tensor, Q4_0Tensor, Q4_1Tensor, Q5_0Tensor, Q5_1Tensor, Q4_KTensor,
                                            Q5_KTensor, Q6_KTensor)}


def kept_format(qtype_name: str) -> Optional[Type[QuantizedTensor]]:
    """The class that keeps a gguf tensor of this type quantized, or None (it is widened)."""
    return KEPT_FORMATS.get(qtype_name)


Weight = Union[torch.Tensor, QuantizedTensor]


def take(t: Weight, rows: Optional[Tuple[int, int]] = None, cols: Optional[Tuple[int, int]] = None) -> Weight:
    """A slice [rows[0]:rows[0] + rows[1], cols[0]:cols[0] + cols[1]] of a plain or quantized
    weight. A quantized one whose slice would cut its blocks (a tensor-parallel split of a
    K-quant's 256-blocks, e.g. 4864 inputs over 2 ranks; of an FP8 weight's 128-row scale blocks)
    is widened first: never a wrong split."""
    if rows is not None:
        if isinstance(t, QuantizedTensor) and not t.splits_rows_at(*rows):
            t = t.dequantize()
        t = t.rows(*rows) if isinstance(t, QuantizedTensor) else t[rows[0]:rows[0] + rows[1]]
    if cols is not None:
        if isinstance(t, QuantizedTensor) and not t.splits_cols_at(*cols):
            t = t.dequantize()
        t = t.cols(*cols) if isinstance(t, QuantizedTensor) else t[:, cols[0]:cols[0] + cols[1]]
    return t


def _as_q8_0(p: Weight) -> Optional[Q8_0Tensor]:
    """p as Q8_0 blocks where that is exact (Q8_0 itself, Q4_0, Q5_0), else None."""
    if isinstance(p, Q8_0Tensor):
        return p
    if isinstance(p, _NibbleTensor) and not p.HAS_MIN:
        return p.to_q8_0()
    return None


def cat_rows(parts: Sequence[Weight]) -> Weight:
    """Weights stacked along their output rows (fused q/k/v, gate/up): quantized when every part
    is, in one format, or when every part is exactly Q8_0 (Q4_K_M files of Qwen2.5 mix Q5_0 q/k
    with Q8_0 v: stacked as Q8_0 blocks, 1.125 bytes a weight packed against Q5_0's 0.75); widened otherwise."""
    if all(isinstance(p, QuantizedTensor) for p in parts) and len({type(p) for p in parts}) == 1:
        joined = type(parts[0]).cat(parts)
        if joined is not None:
            return joined
    as_q8_0 = [_as_q8_0(p) for p in parts]
    if all(q is not None for q in as_q8_0):
        return cat_rows(as_q8_0)
    # Widened parts join the plain ones where those are (a kept part may still be on the host).
    dev = next((p.device for p in parts if isinstance(p, torch.Tensor)), None)
    return torch.cat([p.dequantize().to(dev) if isinstance(p, QuantizedTensor) else p for p in parts])
