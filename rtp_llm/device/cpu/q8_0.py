"""The CPU backend's packed GGUF projection weight of a 32-weight block format (Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1): what pack_linear / pack_gate_up / pack_lm_head make of a model_loader.quantized
Q8_0Tensor, Q4_0Tensor, ... and linear / gate_up_silu / lm_head consume (the compute ops'
q8_0_linear, which runs every one of them)."""

from dataclasses import dataclass

import torch


@dataclass
class Q8_0Linear:
    """HF's [out_features, in_features] weight in the 32-block kernels' layout (rtp_llm/cpp/ops/
    cpu/q8_0.h): `packed` uint8 [ceil(out / 16), in / 32, record], per 16 output columns and
    32-block of inputs their quants (Q8_0: int8, one `vpdpbusd` operand per 4 inputs; the 4- and
    5-bit formats: nibbles and a 5th-bit plane), fp16 scales, int16 sums and (Q4_1, Q5_1) fp16
    mins; the last group padded with zero columns. Bytes per weight (the file's): Q8_0 1.125
    (1.0625), Q4_0 0.625 (0.5625), Q4_1 and Q5_0 0.75 (0.625, 0.6875), Q5_1 0.875 (0.75).
    `qtype`: the file's format it was packed from, which q8_0_linear is told.
    """

    packed: torch.Tensor
    out_features: int
    in_features: int
    qtype: str = "Q8_0"

    @property
    def nbytes(self) -> int:
        return self.packed.numel()
