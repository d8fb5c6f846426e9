"""Checkpoint tensors kept quantized as stored: a GGUF Q8_0 projection weight stays in the
file's blocks (no bf16 copy) until a backend that computes on them packs it
(DeviceBackend.keeps_quantized / pack_linear); elsewhere it is widened at that point. The
block format's sizes come from the gguf package (GGML_QUANT_SIZES), the one declaration on
this side; the CPU kernels declare theirs in rtp_llm/cpp/ops/cpu/q8_0.h."""

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import numpy as np
import torch


def _q8_0_sizes() -> Tuple[int, int]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0]  # (weights per block, bytes per block)


@dataclass
class Q8_0Tensor:
    """An HF-shaped [out, in] weight as GGUF Q8_0 blocks: `blocks` uint8 [out, in / 32 * 34],
    each row its in / 32 blocks in order (an fp16 scale, then 32 int8: w = scale * q). `dtype`
    is what dequantize() widens to (the run dtype)."""

    blocks: torch.Tensor
    shape: Tuple[int, int]
    dtype: torch.dtype

    @staticmethod
    def from_gguf(data: np.ndarray, shape: Sequence[int], dtype: torch.dtype) -> "Q8_0Tensor":
        block, nbytes = _q8_0_sizes()
        out, inp = int(shape[0]), int(shape[1])
        if inp % block or data.shape != (out, inp // block * nbytes):
            raise ValueError(f"a Q8_0 tensor of shape {tuple(shape)} needs {inp // block * nbytes} bytes a row, "
                             f"got {data.shape}")
        return Q8_0Tensor(torch.from_numpy(np.array(data, dtype=np.uint8)), (out, inp), dtype)  # a writable copy

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def rows(self, start: int, n: int) -> "Q8_0Tensor":
        return Q8_0Tensor(self.blocks[start:start + n], (n, self.shape[1]), self.dtype)

    def cols(self, start: int, n: int) -> "Q8_0Tensor":
        block, nbytes = _q8_0_sizes()
        if start % block or n % block:
            raise ValueError(f"a Q8_0 weight splits along its input only at multiples of {block}, "
                             f"not [{start}, {start + n})")
        b = self.blocks[:, start // block * nbytes:(start + n) // block * nbytes]
        return Q8_0Tensor(b.contiguous(), (self.shape[0], n), self.dtype)

    def pad_rows(self, n: int) -> "Q8_0Tensor":
        """n zero rows appended (all-zero blocks: scale 0, weights 0)."""
        pad = self.blocks.new_zeros(n, self.blocks.shape[1])
        return Q8_0Tensor(torch.cat([self.blocks, pad]), (self.shape[0] + n, self.shape[1]), self.dtype)

    def permute_rows(self, index: torch.Tensor) -> "Q8_0Tensor":
        """Rows reordered: row i of the result is row index[i] (whole rows: blocks never span them)."""
        return Q8_0Tensor(self.blocks[index].contiguous(), self.shape, self.dtype)

    def dequantize(self) -> torch.Tensor:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        w = dequantize(self.blocks.numpy(), GGMLQuantizationType.Q8_0)
        return torch.from_numpy(np.array(w, dtype=np.float32).reshape(self.shape)).to(self.dtype)


QuantizedTensor = Q8_0Tensor
Weight = Union[torch.Tensor, QuantizedTensor]


def take(t: Weight, rows: Optional[Tuple[int, int]] = None, cols: Optional[Tuple[int, int]] = None) -> Weight:
    """A slice [rows[0]:rows[0] + rows[1], cols[0]:cols[0] + cols[1]] of a plain or quantized weight."""
    if rows is not None:
        t = t.rows(*rows) if isinstance(t, Q8_0Tensor) else t[rows[0]:rows[0] + rows[1]]
    if cols is not None:
        t = t.cols(*cols) if isinstance(t, Q8_0Tensor) else t[:, cols[0]:cols[0] + cols[1]]
    return t


def cat_rows(parts: Sequence[Weight]) -> Weight:
    """Weights stacked along their output rows (fused q/k/v, gate/up): quantized when every part is."""
    if all(isinstance(p, Q8_0Tensor) for p in parts):
        return Q8_0Tensor(torch.cat([p.blocks for p in parts]), (sum(p.shape[0] for p in parts), parts[0].shape[1]),
                          parts[0].dtype)
    return torch.cat([p.dequantize() if isinstance(p, Q8_0Tensor) else p for p in parts])
