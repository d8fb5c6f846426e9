"""Rotary position embedding tables (HF's default, linear, llama3 and yarn scaling)."""

import math

import torch

from rtp_llm.config.model_config import ModelConfig, RopeScaling, yarn_mscale


def _yarn(inv: torch.Tensor, s: RopeScaling, dim: int, base: float) -> torch.Tensor:
    """transformers' _compute_yarn_parameters: interpolated frequencies (inv / factor) below the
    correction range, the original ones above it, a linear ramp between."""
    def correction_dim(rotations: float) -> float:
        return (dim * math.log(s.original_max_position / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # (HF: prevents a division by zero)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return (inv / s.factor) * (1 - extrapolation) + inv * extrapolation


def attention_factor(s: RopeScaling) -> float:
    """What yarn multiplies cos and sin by (1 for the other kinds)."""
    if s.kind != "yarn":
        return 1.0
    if s.attention_factor is not None:
        return s.attention_factor
    if s.mscale and s.mscale_all_dim:
        return float(yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim))
    return yarn_mscale(s.factor)


def inv_frequencies(c: ModelConfig) -> torch.Tensor:
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.int64).float() / c.head_dim))
    s = c.rope_scaling
    if s.kind == "linear":
        inv = inv / s.factor
    elif s.kind == "yarn":
        inv = _yarn(inv, s, c.head_dim, c.rope_theta)
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
    """(cos, sin), each [max_positions, head_dim / 2] float32, times yarn's attention factor."""
    t = torch.arange(max_positions, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_frequencies(c))
    f = attention_factor(c.rope_scaling)
    if f == 1.0:
        return freqs.cos(), freqs.sin()
    return freqs.cos() * f, freqs.sin() * f
