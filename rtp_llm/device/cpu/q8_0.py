"""The CPU backend's packed GGUF Q8_0 projection weight: what pack_linear / pack_gate_up /
pack_lm_head make of a model_loader.quantized.Q8_0Tensor and linear / gate_up_silu / lm_head
consume (the compute ops' q8_0_linear)."""

from dataclasses import dataclass

import torch


@dataclass
class Q8_0Linear:
    """HF's [out_features, in_features] weight in the Q8_0 kernels' layout (rtp_llm/cpp/ops/cpu/
    q8_0.h): `packed` uint8 [ceil(out / 16), in / 32, 576], per 16 output columns and 32-block
    of inputs their int8 weights (one `vpdpbusd` operand per 4 inputs), fp16 scales and int16
    sums; the last group padded with zero columns. ~1.125 bytes a weight (the file: 1.0625)."""

    packed: torch.Tensor
    out_features: int
    in_features: int

    @property
    def nbytes(self) -> int:
        return self.packed.numel()
