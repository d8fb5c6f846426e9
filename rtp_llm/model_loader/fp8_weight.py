"""An FP8 (e4m3) checkpoint weight kept as stored, for a backend with FP8 kernels (CUDA on Hopper:
device/cuda/kernels/fp8.py); the others widen it exactly with dequantize() (the dequant.py contract).

Every scale layout is one form here, a grid of blocks: `scale` fp32 [ceil(N / bn), ceil(K / bk)]
multiplies the weights of its bn x bk block (edge blocks partial). A per-tensor scale is a
per-row one repeated (bn = 1, bk = K: one scale per row), a per-channel scale is that too, and
a block-FP8 checkpoint's `weight_scale_inv` is the grid itself. So slicing, stacking and the
kernels know one layout, and W[n, k] = e4m3 value x scale[n // bn, k // bk], one fp32 product."""

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Optional, Sequence, Tuple

import torch

from rtp_llm.model_loader.quantized import QuantizedTensor


E4M3_MAX = 448.0  # e4m3's largest finite value


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def quantize_per_row(w: torch.Tensor, dtype: torch.dtype) -> "Fp8Tensor":
    """w [N, K] as e4m3 codes with one fp32 scale per row (its max |w| / 448; 1 for an all-zero
    row), computed where w is; dequantizes to `dtype`."""
    wf = w.float()
    amax = wf.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return Fp8Tensor.per_row((wf / scale).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale, dtype)


@dataclass
class Fp8Tensor(QuantizedTensor):
    """`blocks`: the e4m3 weight [N, K] (HF's [out, in]); `shape` (N, K); `dtype`: what
    dequantize() rounds to (the run dtype); `scale` fp32 [ceil(N / bn), ceil(K / bk)]; `block`
    (bn, bk). Per-row scales: bn = 1 and bk >= K."""

    QTYPE: ClassVar[str] = "FP8_E4M3"

    scale: torch.Tensor = None
    block: Tuple[int, int] = (1, 1)

    def __post_init__(self):
        n, k = self.shape
        bn, bk = self.block
        want = (_ceil(n, bn), _ceil(k, bk))
        if self.blocks.dtype != torch.float8_e4m3fn or tuple(self.blocks.shape) != (n, k):
            raise ValueError(f"an FP8 weight is float8_e4m3fn {n, k}, got {self.blocks.dtype} "
                             f"{tuple(self.blocks.shape)}")
        if tuple(self.scale.shape) != want or self.scale.dtype != torch.float32:
            raise ValueError(f"the scales of a {n} x {k} FP8 weight in {bn} x {bk} blocks are float32 {want}, got "
                             f"{self.scale.dtype} {tuple(self.scale.shape)}")

    @classmethod
    def per_row(cls, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> "Fp8Tensor":
        """scale: one value per row ([N] or [N, 1]) or one for the whole tensor."""
        n, k = weight.shape
        s = scale.float().reshape(-1, 1).expand(n, 1).contiguous()
        return cls(weight, (n, k), dtype, s, (1, max(k, 1)))

    def to(self, device) -> "Fp8Tensor":
        """The same weight on `device`."""
        return replace(self, blocks=self.blocks.to(device), scale=self.scale.to(device))

    @property
    def row_scaled(self) -> bool:
        """One scale per row (per-tensor and per-channel checkpoints)."""
        return self.block[0] == 1 and self.block[1] >= self.shape[1]

    @property
    def nbytes(self) -> int:
        return self.blocks.numel() + 4 * self.scale.numel()

    def _splits(self, start: int, n: int, size: int, b: int) -> bool:
        return start % b == 0 and (n % b == 0 or start + n == size)

    def splits_rows_at(self, start: int, n: int) -> bool:
        """Whether rows(start, n) keeps whole blocks of scales (or ends at the last, partial one)."""
        return self._splits(start, n, self.shape[0], self.block[0])

    def splits_cols_at(self, start: int, n: int) -> bool:
        return self.row_scaled or self._splits(start, n, self.shape[1], self.block[1])

    def rows(self, start: int, n: int) -> "Fp8Tensor":
        if not self.splits_rows_at(start, n):
            raise ValueError(f"an FP8 weight in {self.block} blocks splits its rows only at multiples of "
                             f"{self.block[0]}, not [{start}, {start + n})")
        bn = self.block[0]
        s = self.scale[start // bn:_ceil(start + n, bn)]
        return replace(self, blocks=self.blocks[start:start + n], shape=(n, self.shape[1]), scale=s)

    def cols(self, start: int, n: int) -> "Fp8Tensor":
        if not self.splits_cols_at(start, n):
            raise ValueError(f"an FP8 weight in {self.block} blocks splits its inputs only at multiples of "
                             f"{self.block[1]}, not [{start}, {start + n})")
        w = self.blocks[:, start:start + n].contiguous()
        if self.row_scaled:
            return replace(self, blocks=w, shape=(self.shape[0], n), block=(1, max(n, 1)))
        bk = self.block[1]
        return replace(self, blocks=w, shape=(self.shape[0], n), scale=self.scale[:, start // bk:_ceil(start + n, bk)])

    @classmethod
    def cat(cls, parts: Sequence["Fp8Tensor"]) -> Optional["Fp8Tensor"]:
        """The parts stacked along their rows (fused q/k/v, gate/up), or None where their scales
        cannot make one grid (different blocks of inputs). A part before the last whose rows end
        in a partial block (Qwen3's k/v of 64 rows beside 128-row blocks) refines the grid's rows:
        bn' = gcd(bn, those row counts), each scale repeated bn / bn' times, exact."""
        first = parts[0]
        if any(p.shape[1] != first.shape[1] for p in parts):
            return None
        if all(p.row_scaled for p in parts):
            block = (1, max(first.shape[1], 1))
            scales = [p.scale for p in parts]
        elif all(p.block == first.block for p in parts):
            bn, bk = first.block
            fine = math.gcd(bn, *(p.shape[0] for p in parts[:-1]))
            block = (fine, bk)
            scales = [p.scale.repeat_interleave(bn // fine, dim=0)[:_ceil(p.shape[0], fine)] for p in parts]
        else:
            return None
        return cls(torch.cat([p.blocks for p in parts]), (sum(p.shape[0] for p in parts), first.shape[1]), first.dtype,
                   torch.cat(scales), block)

    def pad_rows(self, n: int) -> "Fp8Tensor":
        raise NotImplementedError("FP8 embedding tables are widened at load")

    def permute_rows(self, index: torch.Tensor) -> "Fp8Tensor":
        raise NotImplementedError("FP8 weights come from HF checkpoints, whose rows need no permutation")

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("FP8 embedding tables are widened at load")

    def dequantize(self) -> torch.Tensor:
        """Each weight times its block's scale, one fp32 product (exact), rounded to `dtype`."""
        n, k = self.shape
        bn, bk = self.block
        rows = self.scale.repeat_interleave(bn, dim=0)[:n]  # [N, ceil(K / bk)]: never a second [N, K] of scales
        w = self.blocks.float()
        full, rest = divmod(k, bk)
        if full:
            w[:, :full * bk].unflatten(1, (full, bk)).mul_(rows[:, :full, None])
        if rest:
            w[:, full * bk:].mul_(rows[:, full:])
        return w.to(self.dtype)
