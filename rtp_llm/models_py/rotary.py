"""Rotary position embedding tables (HF's default, linear and llama3 scaling)."""

import math

import torch

from rtp_llm.config.model_config import ModelConfig


def inv_frequencies(c: ModelConfig) -> torch.Tensor:
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.int64).float() / c.head_dim))
    s = c.rope_scaling
    if s.kind == "linear":
        inv = inv / s.factor
    elif s.kind == "llama3":
        low_wavelen = s.original_max_position / s.low_freq_factor
        high_wavelen = s.original_max_position / s.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
        smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def cos_sin_table(c: ModelConfig, max_positions: int):
    """(cos, sin), each [max_positions, head_dim / 2] float32."""
    t = torch.arange(max_positions, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_frequencies(c))
    return freqs.cos(), freqs.sin()
