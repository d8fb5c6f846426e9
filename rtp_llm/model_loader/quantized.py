"""Checkpoint tensors kept quantized as stored: a GGUF Q8_0, Q4_K or Q6_K projection weight stays
in the file's blocks (no bf16 copy) until a backend that computes on it packs it
(DeviceBackend.keeps_quantized / pack_linear); elsewhere it is widened at that point. The
formats' block sizes come from the gguf package (GGML_QUANT_SIZES), the one declaration on this
side; the CPU kernels declare theirs in rtp_llm/cpp/ops/cpu/q8_0.h and kquant.h."""

from dataclasses import dataclass
from typing import ClassVar, Optional, Sequence, Tuple, Type, Union

import numpy as np
import torch


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
    def from_gguf(cls, data: np.ndarray, shape: Sequence[int], dtype: torch.dtype) -> "QuantizedTensor":
        block, nbytes = _sizes(cls.QTYPE)
        out, inp = int(shape[0]), int(shape[1])
        if inp % block or data.shape != (out, inp // block * nbytes):
            raise ValueError(f"a {cls.QTYPE} tensor of shape {tuple(shape)} needs {inp // block * nbytes} bytes a row, "
                             f"got {data.shape}")
        return cls(torch.from_numpy(np.array(data, dtype=np.uint8)), (out, inp), dtype)  # a writable copy

    @classmethod
    def block_size(cls) -> int:
        return _sizes(cls.QTYPE)[0]

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def rows(self, start: int, n: int) -> "QuantizedTensor":
        return type(self)(self.blocks[start:start + n], (n, self.shape[1]), self.dtype)

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

    def pad_rows(self, n: int) -> "QuantizedTensor":
        """n zero rows appended (all-zero blocks: every scale 0, so every weight 0)."""
        pad = self.blocks.new_zeros(n, self.blocks.shape[1])
        return type(self)(torch.cat([self.blocks, pad]), (self.shape[0] + n, self.shape[1]), self.dtype)

    def permute_rows(self, index: torch.Tensor) -> "QuantizedTensor":
        """Rows reordered: row i of the result is row index[i] (whole rows: blocks never span them)."""
        return type(self)(self.blocks[index].contiguous(), self.shape, self.dtype)

    def dequantize(self) -> torch.Tensor:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        w = dequantize(self.blocks.numpy(), GGMLQuantizationType[self.QTYPE])
        return torch.from_numpy(np.array(w, dtype=np.float32).reshape(self.shape)).to(self.dtype)


class Q8_0Tensor(QuantizedTensor):
    """Q8_0: per 32 weights an fp16 scale, then 32 int8 (w = scale * q); 34 bytes."""

    QTYPE = "Q8_0"


class Q4_KTensor(QuantizedTensor):
    """Q4_K: per 256 weights fp16 d and dmin, 6-bit scales and mins of 8 sub-blocks, 4-bit q
    (w = d * sc * q - dmin * m); 144 bytes. Layout: rtp_llm/cpp/ops/cpu/kquant.h."""

    QTYPE = "Q4_K"


class Q6_KTensor(QuantizedTensor):
    """Q6_K: per 256 weights 6-bit q, int8 scales of 16 sub-blocks, fp16 d (w = d * sc * (q - 32));
    210 bytes. Layout: rtp_llm/cpp/ops/cpu/kquant.h."""

    QTYPE = "Q6_K"


# The formats a checkpoint tensor may stay in, by gguf type name.
KEPT_FORMATS = {cls.QTYPE: cls for cls in (Q8_0Tensor, Q4_KTensor, Q6_KTensor)}


def kept_format(qtype_name: str) -> Optional[Type[QuantizedTensor]]:
    """The class that keeps a gguf tensor of this type quantized, or None (it is widened)."""
    return KEPT_FORMATS.get(qtype_name)


Weight = Union[torch.Tensor, QuantizedTensor]


def take(t: Weight, rows: Optional[Tuple[int, int]] = None, cols: Optional[Tuple[int, int]] = None) -> Weight:
    """A slice [rows[0]:rows[0] + rows[1], cols[0]:cols[0] + cols[1]] of a plain or quantized
    weight. A quantized one whose column slice would cut its blocks (a tensor-parallel split of
    a K-quant's 256-blocks, e.g. 4864 inputs over 2 ranks) is widened first: never a wrong split."""
    if rows is not None:
        t = t.rows(*rows) if isinstance(t, QuantizedTensor) else t[rows[0]:rows[0] + rows[1]]
    if cols is not None:
        if isinstance(t, QuantizedTensor) and not t.splits_cols_at(*cols):
            t = t.dequantize()
        t = t.cols(*cols) if isinstance(t, QuantizedTensor) else t[:, cols[0]:cols[0] + cols[1]]
    return t


def cat_rows(parts: Sequence[Weight]) -> Weight:
    """Weights stacked along their output rows (fused q/k/v, gate/up): quantized when every part
    is, in one format; widened otherwise (Q4_K_M files mix formats within q/k/v)."""
    if all(isinstance(p, QuantizedTensor) for p in parts) and len({type(p) for p in parts}) == 1:
        return type(parts[0])(torch.cat([p.blocks for p in parts]), (sum(p.shape[0] for p in parts), parts[0].shape[1]),
                              parts[0].dtype)
    return torch.cat([p.dequantize() if isinstance(p, QuantizedTensor) else p for p in parts])
