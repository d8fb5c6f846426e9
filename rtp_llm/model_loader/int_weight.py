"""A GPTQ or AWQ checkpoint weight kept packed, for a backend with integer-weight kernels (CUDA:
device/cuda/kernels/wint.py); the others widen it with dequantize(), to exactly the values
dequant.py gives the same tensors.

One layout for both formats (GPTQ packs codes along K in columns of N, AWQ along N in an
interleaved order): row n of `blocks` is output channel n's codes along its inputs, 32 / bits a
word, low bits first, as HF's [out, in] weight is laid out, so that a decode step streams each
row's words in order. Groups are contiguous runs of `group` inputs. GPTQ's desc_act shuffles its
groups over the inputs (g_idx); such a weight's columns are stored sorted by group, and `perm`
says which input each column is (the kernels read the activations through it):

    W[n, perm[j]] = (q[n, j] - zero[n, j // group]) * scale[n, j // group]

one exact fp32 product, (q - zero) an integer (dequant.py's contract)."""

from dataclasses import dataclass, replace
from typing import ClassVar, Optional, Sequence

import torch

from rtp_llm.model_loader.quantized import QuantizedTensor


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def pack_rows(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """int codes [N, K] in [0, 2^bits) -> int32 words [N, K * bits / 32] (K a multiple of
    32 / bits), each row's codes in order, low bits first."""
    per = 32 // bits
    n, k = codes.shape
    c = codes.to(torch.int64).contiguous().view(n, k // per, per)
    words = sum(c[:, :, j] << (bits * j) for j in range(per))
    return ((words + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32).contiguous()


def unpack_rows(words: torch.Tensor, bits: int) -> torch.Tensor:
    """pack_rows' inverse: int32 [N, W] -> int32 codes [N, W * 32 / bits]."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)
    return ((words.unsqueeze(2) >> shifts) & ((1 << bits) - 1)).flatten(1)


@dataclass
class GroupIntTensor(QuantizedTensor):
    """`blocks` int32 [N, K * bits / 32] (the layout above); `shape` (N, K); `dtype` what
    dequantize() rounds to (the run dtype); `scale` [N, G] as the checkpoint stores it (fp16,
    bf16 or fp32), G = ceil(K / group); `zero` int16 [N, G], the zero points as computed with
    (GPTQ v1's stored zero + 1); `group` inputs a group; `bits` 4 or 8; `perm` int32 [K] or None
    (columns in input order)."""

    QTYPE: ClassVar[str] = "INT_GROUP"

    scale: torch.Tensor = None
    zero: torch.Tensor = None
    group: int = 0
    bits: int = 4
    perm: Optional[torch.Tensor] = None

    def __post_init__(self):
        n, k = self.shape
        g = _ceil(k, self.group)
        per = 32 // self.bits
        if self.bits not in (4, 8) or k % per or self.group % per and self.group < k:
            raise ValueError(f"a packed {self.bits}-bit weight needs bits 4 or 8 and K ({k}) and the group "
                             f"({self.group}) multiples of {per}")
        if self.blocks.dtype != torch.int32 or tuple(self.blocks.shape) != (n, k // per):
            raise ValueError(f"packed codes of a {n} x {k} weight are int32 {(n, k // per)}, got "
                             f"{self.blocks.dtype} {tuple(self.blocks.shape)}")
        if tuple(self.scale.shape) != (n, g) or tuple(self.zero.shape) != (n, g):
            raise ValueError(f"scales and zeros of a {n} x {k} weight in groups of {self.group} are {(n, g)}, "
                             f"got {tuple(self.scale.shape)} and {tuple(self.zero.shape)}")

    @property
    def per_word(self) -> int:
        return 32 // self.bits

    @property
    def nbytes(self) -> int:
        p = 0 if self.perm is None else self.perm.numel() * 4
        return self.blocks.numel() * 4 + self.scale.numel() * self.scale.element_size() + self.zero.numel() * 2 + p

    def to(self, device) -> "GroupIntTensor":
        return replace(self, blocks=self.blocks.to(device), scale=self.scale.to(device), zero=self.zero.to(device),
                       perm=None if self.perm is None else self.perm.to(device))

    def rows(self, start: int, n: int) -> "GroupIntTensor":
        end = start + n
        return replace(self, blocks=self.blocks[start:end], shape=(n, self.shape[1]), scale=self.scale[start:end],
                       zero=self.zero[start:end])

    def splits_cols_at(self, start: int, n: int) -> bool:
        """Whole groups (and words) in input order: a desc_act weight's inputs are shuffled."""
        k = self.shape[1]
        if self.perm is not None or start % self.per_word or n % self.per_word:
            return False
        if self.group >= k:  # one group a row: its scale serves any slice
            return True
        return start % self.group == 0 and (n % self.group == 0 or start + n == k)

    def cols(self, start: int, n: int) -> "GroupIntTensor":
        if not self.splits_cols_at(start, n):
            raise ValueError(f"a packed weight in groups of {self.group} splits its inputs only at whole groups in "
                             f"input order, not [{start}, {start + n})")
        w, g = self.per_word, self.group
        return replace(self, blocks=self.blocks[:, start // w:(start + n) // w].contiguous(), shape=(self.shape[0], n),
                       scale=self.scale[:, start // g:_ceil(start + n, g)].contiguous(),
                       zero=self.zero[:, start // g:_ceil(start + n, g)].contiguous(),
                       group=n if g >= self.shape[1] else g)

    @classmethod
    def cat(cls, parts: Sequence["GroupIntTensor"]) -> Optional["GroupIntTensor"]:
        """The parts stacked along their rows (fused q/k/v, gate/up), or None where they differ
        in inputs, bits, groups, scale dtype or input order (GPTQ's act order comes from the
        shared input's statistics, so q/k/v and gate/up share it in published checkpoints)."""
        first = parts[0]
        for p in parts[1:]:
            same_perm = (p.perm is None) == (first.perm is None) and (p.perm is None or torch.equal(p.perm, first.perm))
            if (p.shape[1], p.bits, p.group, p.scale.dtype) != (first.shape[1], first.bits, first.group,
                                                                 first.scale.dtype) or not same_perm:
                return None
        return replace(first, blocks=torch.cat([p.blocks for p in parts]),
                       shape=(sum(p.shape[0] for p in parts), first.shape[1]),
                       scale=torch.cat([p.scale for p in parts]), zero=torch.cat([p.zero for p in parts]))

    def pad_rows(self, n: int) -> "GroupIntTensor":
        """n zero rows (scale 0: every weight 0)."""
        g = self.scale.shape[1]
        return replace(self, blocks=torch.cat([self.blocks, self.blocks.new_zeros(n, self.blocks.shape[1])]),
                       shape=(self.shape[0] + n, self.shape[1]),
                       scale=torch.cat([self.scale, self.scale.new_zeros(n, g)]),
                       zero=torch.cat([self.zero, self.zero.new_zeros(n, g)]))

    def permute_rows(self, index: torch.Tensor) -> "GroupIntTensor":
        return replace(self, blocks=self.blocks[index].contiguous(), scale=self.scale[index].contiguous(),
                       zero=self.zero[index].contiguous())

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("GPTQ / AWQ embedding tables are not a published format")

    def dequantize(self) -> torch.Tensor:
        """(q - zero) * scale, one fp32 product, in input order, rounded to `dtype`."""
        n, k = self.shape
        codes = unpack_rows(self.blocks, self.bits)  # [N, K]
        z = self.zero.to(torch.int32).repeat_interleave(self.group, dim=1)[:, :k]
        w = (codes - z).float().mul_(self.scale.float().repeat_interleave(self.group, dim=1)[:, :k])
        if self.perm is not None:
            w = torch.empty_like(w).index_copy_(1, self.perm.long(), w)
        return w.to(self.dtype)


def from_codes(codes_kn: torch.Tensor, zeros_gn: torch.Tensor, scales_gn: torch.Tensor, group_of_k: torch.Tensor,
               group: int, bits: int, dtype: torch.dtype) -> Optional[GroupIntTensor]:
    """A GroupIntTensor of a checkpoint's unpacked tensors, GPTQ / AWQ's orientation: codes [K, N],
    zeros [G, N] (as computed with), scales [G, N], group_of_k [K]; None where the groups are
    not `group` consecutive inputs in some order (then dequant.py widens the weight)."""
    k = codes_kn.shape[0]
    perm = None
    expected = torch.arange(k, device=group_of_k.device) // group
    if not torch.equal(group_of_k, expected):
        order = torch.sort(group_of_k, stable=True).indices
        if not torch.equal(group_of_k[order], expected):
            return None
        perm = order.to(torch.int32)
        codes_kn = codes_kn[order]
    return from_words(pack_rows(codes_kn.t(), bits), k, zeros_gn, scales_gn, group, bits, dtype, perm)


def from_words(words: torch.Tensor, k: int, zeros_gn: torch.Tensor, scales_gn: torch.Tensor, group: int, bits: int,
               dtype: torch.dtype, perm: Optional[torch.Tensor] = None) -> GroupIntTensor:
    """A GroupIntTensor of words already in the row layout (int32 [N, K * bits / 32]; GPTQ's
    qweight transposed is, when its groups are in input order), zeros [G, N], scales [G, N]."""
    return GroupIntTensor(words.contiguous(), (words.shape[0], k), dtype, scales_gn.t().contiguous(),
                          zeros_gn.t().to(torch.int16).contiguous(), group, bits, perm)
