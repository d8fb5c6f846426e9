"""Test-only GGUF Q4_K / Q6_K quantizers (the gguf package has none): simple round-to-nearest
per sub-block, written in llama.cpp's block layouts (rtp_llm/cpp/ops/cpu/kquant.h documents
them), so that gguf's own dequantizer reads them back. Not llama.cpp's error-minimizing search:
the tests need valid blocks of realistic weights, not the best ones."""

import numpy as np

SUPER = 256


def _fp16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros_like(a, dtype=np.float32), where=b != 0)


def _q4_k_scale_bytes(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """[..., 8] 6-bit scales and mins -> [..., 12] bytes (the inverse of get_scale_min_k4)."""
    s = np.zeros(sc.shape[:-1] + (12,), dtype=np.uint8)
    s[..., 0:4] = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
    s[..., 4:8] = (m[..., 0:4] & 63) | ((m[..., 4:8] >> 4) << 6)
    s[..., 8:12] = (sc[..., 4:8] & 0xF) | ((m[..., 4:8] & 0xF) << 4)
    return s


def quantize_q4_k(a: np.ndarray) -> np.ndarray:
    """fp32 [N, K] (K % 256 == 0) -> uint8 [N, K / 256 * 144]: per 32 weights w ~ d sc q - dmin m."""
    n, k = a.shape
    x = a.reshape(n, k // SUPER, 8, 32).astype(np.float32)
    lo = np.minimum(x.min(-1), 0.0)
    scale, negmin = (x.max(-1) - lo) / 15.0, -lo
    d, dmin = _fp16(scale.max(-1) / 63.0), _fp16(negmin.max(-1) / 63.0)
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float32)[..., None])), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_safe_div(negmin, dmin.astype(np.float32)[..., None])), 0, 63).astype(np.uint8)
    step = d.astype(np.float32)[..., None] * sc
    offset = dmin.astype(np.float32)[..., None] * m
    q = np.clip(np.rint(_safe_div(x + offset[..., None], step[..., None] * np.ones_like(x))), 0, 15).astype(np.uint8)
    q = q.reshape(n, k // SUPER, 4, 2, 32)  # 64-weight chunks: the low nibbles' 32, then the high ones'
    qs = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).reshape(n, k // SUPER, 128)
    blocks = np.concatenate([d.view(np.uint8).reshape(n, -1, 2), dmin.view(np.uint8).reshape(n, -1, 2),
                             _q4_k_scale_bytes(sc, m), qs], axis=-1)
    return blocks.reshape(n, -1)


def quantize_q6_k(a: np.ndarray) -> np.ndarray:
    """fp32 [N, K] (K % 256 == 0) -> uint8 [N, K / 256 * 210]: per 16 weights w ~ d sc (q - 32)."""
    n, k = a.shape
    x = a.reshape(n, k // SUPER, 16, 16).astype(np.float32)
    scale = np.abs(x).max(-1) / 31.0
    d = _fp16(scale.max(-1) / 127.0)
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float32)[..., None])), -128, 127).astype(np.int8)
    step = d.astype(np.float32)[..., None] * sc
    q = np.clip(np.rint(_safe_div(x, step[..., None] * np.ones_like(x))) + 32, 0, 63).astype(np.uint8)
    q = q.reshape(n, k // SUPER, 2, 4, 32)  # [half h][i][l]: weight 128h + 32i + l
    low, high = q & 0xF, q >> 4
    ql = np.concatenate([low[:, :, :, 0] | (low[:, :, :, 2] << 4), low[:, :, :, 1] | (low[:, :, :, 3] << 4)], axis=-1)
    qh = high[:, :, :, 0] | (high[:, :, :, 1] << 2) | (high[:, :, :, 2] << 4) | (high[:, :, :, 3] << 6)
    blocks = np.concatenate([ql.reshape(n, -1, 128), qh.reshape(n, -1, 64), sc.view(np.uint8),
                             d.view(np.uint8).reshape(n, -1, 2)], axis=-1)
    return blocks.reshape(n, -1)


QUANTIZERS = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}
