"""The CPU backend's packed GGUF Q4_K / Q5_K / Q6_K projection weights: what pack_linear /
pack_gate_up / pack_lm_head make of a model_loader.quantized.Q4_KTensor, Q5_KTensor or Q6_KTensor
and linear / gate_up_silu / lm_head consume (the compute ops' q4_k_linear / q5_k_linear /
q6_k_linear)."""

from dataclasses import dataclass

import torch

# The loader's class name of each format -> the compute ops' name stem (pack_<stem>_linear,
# <stem>_linear).
OPS_STEMS = {"Q4_KTensor": "q4_k", "Q5_KTensor": "q5_k", "Q6_KTensor": "q6_k"}


@dataclass
class KQuantLinear:
    """HF's [out_features, in_features] weight in the k-quant kernels' layout (rtp_llm/cpp/ops/cpu/
    kquant.h): `packed` uint8 [ceil(out / 16), in / 256, record], per 16 output columns and
    256-block of inputs their quants as `vpdpbusd` operands, sub-block scales (and Q4_K's mins)
    and fp16 super-block scales; the last group padded with zero columns. Q4_K: 2368 bytes per
    16 x 256 weights (the file: 2304), Q5_K: 2880 (2816), Q6_K: 3392 (3360). `stem` names the
    format's ops ("q4_k", "q5_k" or "q6_k")."""

    packed: torch.Tensor
    out_features: int
    in_features: int
    stem: str

    @property
    def nbytes(self) -> int:
        return self.packed.numel()
