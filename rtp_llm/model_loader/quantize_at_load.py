"""--quantization at load (upstream's flag; its --int8_mode=1 is the same as int8): a checkpoint's
floating-point projection weights quantized as they are read, for the backends that compute on
the result.

int8 is weight-only: each row's blocks of 32 inputs share one fp16 scale (GGUF's Q8_0 layout,
w = d * q, q in [-127, 127], d = the block's max |w| / 127), so the CPU computes on them with
its Q8_0 kernels (device/cpu/q8_0.py). Blocks of 32 are finer than upstream's per-channel
scales: the error per weight is at most d / 2 of its own block. What stays in its dtype: norms,
biases, the embedding table and a tied LM head (looked up by row), weights whose inputs are not
a multiple of 32, and tensors the checkpoint already quantized (GGUF blocks).

int8 on CUDA is per output row instead (upstream's per-channel weight-only int8): each attention
and dense-MLP projection becomes int8 codes (stored as q + 128, a GroupIntTensor of 8 bits and one
group a row) with one fp32 scale per row (its max |w| / 127), which the integer-weight kernels
compute on (device/cuda/kernels/wint.py); the LM head stays in the run dtype.

fp8 (CUDA): each attention and dense-MLP projection becomes e4m3 codes with one fp32 scale per
output row (its max |w| / 448), the format the CUDA backend's FP8 kernels compute on
(device/cuda/kernels/fp8.py); activations are quantized per row at run time above 4 rows.

The flag's values, what they mean and where they run are declared once, in
config/quantization.py (checked before anything loads)."""

from typing import Dict, Optional

import torch

from rtp_llm.model_loader.fp8_weight import Fp8Tensor, quantize_per_row
from rtp_llm.model_loader.int_weight import GroupIntTensor, pack_rows
from rtp_llm.model_loader.quantized import Q8_0Tensor, QuantizedTensor, kept_projection
from rtp_llm.model_loader.registry import UnsupportedModelError

_QUANTIZED_NAMES = ("_proj.weight", "lm_head.weight")
_Q8_0_BLOCK = 32
_Q8_0_MAX = 127


def quantize_q8_0(w: torch.Tensor) -> Q8_0Tensor:
    """w [N, K] (K a multiple of 32) as Q8_0 blocks: per row and 32 inputs an fp16 scale d then
    32 int8 q with w ~ d * q (d rounded to fp16 first, so q is rounded against the stored d)."""
    n, k = w.shape
    blocks = w.float().reshape(n, k // _Q8_0_BLOCK, _Q8_0_BLOCK)
    d = (blocks.abs().amax(-1) / _Q8_0_MAX).half()
    inv = torch.where(d > 0, 1.0 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    q = torch.round(blocks * inv.unsqueeze(-1)).clamp_(-_Q8_0_MAX, _Q8_0_MAX).to(torch.int8)
    raw = torch.cat([d.unsqueeze(-1).view(torch.uint8), q.view(torch.uint8)], dim=-1)
    return Q8_0Tensor(raw.reshape(n, -1).contiguous(), (n, k), w.dtype)


def _quantizable(name: str, t, tied_head: bool) -> bool:
    return (isinstance(t, torch.Tensor) and t.dim() == 2 and t.is_floating_point() and name.endswith(_QUANTIZED_NAMES)
            and t.shape[1] % _Q8_0_BLOCK == 0 and not (tied_head and name.endswith("lm_head.weight")))


def quantize_weights(weights: Dict[str, object], quantization: Optional[str], config, device: str = "cpu") -> int:
    """Quantizes `weights` in place by the scheme (one tensor at a time: the widened copy goes as
    its blocks arrive); returns how many tensors it quantized. MoE and MLA models are refused by
    name: their expert stacks and absorbed projections take float weights only. fp8 quantizes
    each projection on `device` (a GPU: seconds for an 8B model) and returns it where the weight
    was (the host: each rank moves its own slice, as with bf16 weights)."""
    if quantization is None:
        return 0
    if config.moe is not None or config.mla is not None:
        raise UnsupportedModelError(f"--quantization={quantization} is not supported for model_type {config.model_type} yet "
                         f"(its experts and latent attention take float weights only)")
    if quantization == "fp8":
        return _quantize_fp8(weights, config, device)
    if quantization == "int8" and device.startswith("cuda"):
        return _quantize_int8_rows(weights, config, device)
    count = 0
    for name in list(weights):
        w = weights[name]
        if isinstance(w, (Fp8Tensor, GroupIntTensor)):  # a packed checkpoint's projection: requantized
            w = weights[name] = w.dequantize()          # from its values
        if _quantizable(name, w, config.tie_word_embeddings):
            weights[name] = quantize_q8_0(w)
            count += 1
    return count


def quantize_int8_rows(w: torch.Tensor, dtype: torch.dtype) -> GroupIntTensor:
    """w [N, K] as int8 codes with one fp32 scale per row (its max |w| / 127; 1 for an all-zero
    row), computed where w is, stored as q + 128 in [1, 255] (zero point 128); dequantizes to dtype."""
    wf = w.float()
    n, k = wf.shape
    amax = wf.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / _Q8_0_MAX, torch.ones_like(amax))
    codes = torch.round(wf / scale).clamp_(-_Q8_0_MAX, _Q8_0_MAX).to(torch.int32) + 128
    zero = torch.full((n, 1), 128, dtype=torch.int16, device=w.device)
    return GroupIntTensor(pack_rows(codes, 8), (n, k), dtype, scale, zero, k, 8)


def _quantize_int8_rows(weights: Dict[str, object], config, device: str) -> int:
    count = 0
    for name in list(weights):
        w = weights[name]
        if isinstance(w, (Fp8Tensor, GroupIntTensor)):
            w = w.dequantize()
        if isinstance(w, torch.Tensor) and w.is_floating_point() and kept_projection(config, name):
            weights[name] = quantize_int8_rows(w.to(device), w.dtype).to(w.device)
            count += 1
    return count


def _quantize_fp8(weights: Dict[str, object], config, device: str) -> int:
    _check_fp8(weights, device)
    count = 0
    for name in list(weights):
        w = weights[name]
        if isinstance(w, Fp8Tensor) and w.row_scaled:
            continue  # already per-row FP8: kept as the checkpoint stores it
        if isinstance(w, (Fp8Tensor, GroupIntTensor)):
            w = w.dequantize()  # block FP8, GPTQ, AWQ: requantized per row from their values
        if isinstance(w, torch.Tensor) and w.is_floating_point() and kept_projection(config, name):
            weights[name] = quantize_per_row(w.to(device), w.dtype).to(w.device)
            count += 1
    return count


def _check_fp8(weights: Dict[str, object], device: str) -> None:
    """fp8 runs where the FP8 kernels do (CUDA on Hopper) and on float or FP8 weights: a GGUF
    file's blocks would be widened, not quantized, so it is refused."""
    if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
        raise UnsupportedModelError("--quantization=fp8 needs a Hopper GPU (compute capability 9.0+: FP8 GEMMs with "
                                    "row-wise scales); this GPU would run the weights widened to bf16")
    hf_packed = (Fp8Tensor, GroupIntTensor)
    if any(isinstance(w, QuantizedTensor) and not isinstance(w, hf_packed) for w in weights.values()):
        raise UnsupportedModelError("--quantization=fp8 takes HF checkpoints (float or FP8 weights); a GGUF file's "
                                    "quantized blocks load as they are, without the flag")
