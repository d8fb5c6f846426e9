"""References the quantized-linear tests check the kernels against: gguf's own dequantizer, and
activations rounded as the kernels quantize them (per row and block, llama.cpp's q8 scheme)."""

import numpy as np
import torch


def dequantized(qtype: str, blocks: torch.Tensor, shape) -> torch.Tensor:
    """The fp32 weight [shape] of a GGUF tensor's rows `blocks` (uint8) of type `qtype` ("Q8_0", ...)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    w = dequantize(blocks.numpy(), GGMLQuantizationType[qtype])
    return torch.from_numpy(np.array(w, dtype=np.float32).reshape(shape))


def quantized_activations(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [M, K] fp32 as the kernels see it: per row and `block` values d = max|x| / 127, q =
    round-half-even(x * (1 / d)), back to d * q (fp64)."""
    b = x.reshape(x.shape[0], -1, block)
    d = b.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    return (torch.round(b * inv).double() * d.double()).reshape(x.shape)
