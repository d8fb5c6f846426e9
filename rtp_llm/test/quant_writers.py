"""Test-only writers of quantized HF checkpoints, as published checkpoints name and pack them:
block / per-tensor FP8 (transformers' and vLLM's `fp8`), compressed-tensors' per-channel FP8,
FBGEMM FP8, GPTQ (v1 and v2 zero points, desc_act's shuffled g_idx, 4 and 8 bits) and AWQ GEMM,
each from a tiny plain checkpoint (testlib.make_tiny).

Beside each, the reference: the same model with the exactly dequantized weights as a plain HF
checkpoint, computed here from the integer / e4m3 codes and scales before they are packed, block
by block and group by group (written apart from rtp_llm/model_loader/dequant.py on purpose, so
that one checks the other)."""

import json
import os
import shutil
from typing import Dict, Optional, Sequence, Tuple

import torch
from safetensors.torch import load_file, save_file

E4M3_MAX = 448.0
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's AWQ_ORDER: nibble i of a word holds column ORDER[i]

Stored = Dict[str, torch.Tensor]  # suffix ("weight", "weight_scale_inv", "qweight", ...) -> tensor


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------ FP8


def fp8_block(w: torch.Tensor, bn: int, bk: int) -> Tuple[Stored, torch.Tensor]:
    """DeepSeek-V3 / Qwen3-FP8: e4m3 [N, K], weight_scale_inv fp32 [ceil(N / bn), ceil(K / bk)]
    (the multiplier: block amax / 448); edge blocks partial."""
    n, k = w.shape
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    scale = torch.empty(_ceil(n, bn), _ceil(k, bk))
    ref = torch.empty(n, k)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            rows, cols = slice(i * bn, (i + 1) * bn), slice(j * bk, (j + 1) * bk)
            s = w[rows, cols].abs().max() / E4M3_MAX
            codes = (w[rows, cols] / s).to(torch.float8_e4m3fn)
            q[rows, cols], scale[i, j] = codes, s
            ref[rows, cols] = codes.float() * s
    return {"weight": q, "weight_scale_inv": scale}, ref


def fp8_tensor(w: torch.Tensor, scale_name: str, scalar_shape: Sequence[int] = ()) -> Tuple[Stored, torch.Tensor]:
    s = (w.abs().max() / E4M3_MAX).reshape(scalar_shape)
    codes = (w / s.reshape(())).to(torch.float8_e4m3fn)
    return {"weight": codes, scale_name: s}, codes.float() * s.reshape(())


def fp8_tensor_static(w: torch.Tensor) -> Tuple[Stored, torch.Tensor]:
    """vLLM / AutoFP8 per-tensor: weight_scale [1], and a static activation scale (input_scale),
    which weight dequantization does not use."""
    stored, ref = fp8_tensor(w, "weight_scale", (1,))
    return {**stored, "input_scale": torch.tensor([0.05])}, ref


def fp8_channel(w: torch.Tensor, scale_dtype: torch.dtype) -> Tuple[Stored, torch.Tensor]:
    """compressed-tensors (scale in the model's dtype) / FBGEMM (fp32): weight_scale [N, 1]."""
    scale = (w.abs().amax(dim=1, keepdim=True) / E4M3_MAX).to(scale_dtype)
    codes = (w / scale.float()).to(torch.float8_e4m3fn)
    ref = torch.empty_like(w)
    for r in range(w.shape[0]):
        ref[r] = codes[r].float() * scale[r, 0].float()
    return {"weight": codes, "weight_scale": scale}, ref


# ------------------------------------------------------------------ GPTQ / AWQ


def _wrap_int32(x: torch.Tensor) -> torch.Tensor:
    return ((x + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32)


def _group_codes(wg: torch.Tensor, bits: int, sym: bool, min_zero: int):
    """Per output column of one group's rows wg [rows, N]: fp16 scale, integer zero, codes."""
    maxq = 2 ** bits - 1
    if sym:
        scale = (2 * wg.abs().amax(dim=0) / maxq).half()
        zero = torch.full((wg.shape[1],), 2 ** (bits - 1), dtype=torch.int64)
    else:
        lo, hi = wg.amin(dim=0), wg.amax(dim=0)
        scale = ((hi - lo) / maxq).half()
        zero = torch.round(-lo / scale.float()).long().clamp(min_zero, maxq)
    codes = (torch.round(wg / scale.float()).long() + zero).clamp(0, maxq)
    return scale, zero, codes


def _quantize_groups(wt: torch.Tensor, group_of_k: torch.Tensor, groups: int, bits: int, sym: bool, min_zero: int):
    """wt [K, N] quantized per group of input channels (group_of_k [K]): (codes [K, N] long,
    zeros [G, N] long, scales [G, N] fp16), each group through _group_codes."""
    k, n = wt.shape
    codes = torch.empty(k, n, dtype=torch.long)
    zeros = torch.empty(groups, n, dtype=torch.long)
    scales = torch.empty(groups, n, dtype=torch.float16)
    for g in range(groups):
        rows = group_of_k == g
        scales[g], zeros[g], codes[rows] = _group_codes(wt[rows], bits, sym, min_zero)
    return codes, zeros, scales


def _reference(codes, zeros, scales, group_of_k) -> torch.Tensor:
    """W^T [K, N] = (q - z) * s, group by group."""
    ref = torch.empty(codes.shape)
    for g in range(scales.shape[0]):
        rows = group_of_k == g
        ref[rows] = (codes[rows] - zeros[g]).float() * scales[g].float()
    return ref


def gptq(w: torch.Tensor, bits: int, group_size: int, sym: bool = True, desc_act: bool = False,
         v2: bool = False, seed: int = 0) -> Tuple[Stored, torch.Tensor]:
    """AutoGPTQ's layout: qweight int32 [K / per, N] (codes along K, low bits first), qzeros
    int32 [G, N / per] (zero - 1 in v1), scales fp16 [G, N], g_idx int32 [K] (desc_act: the
    group of each input channel after a random activation order)."""
    wt = w.t()  # [K, N]
    k, n = wt.shape
    per = 32 // bits
    size = k if group_size == -1 else group_size
    groups = _ceil(k, size)
    if desc_act:
        perm = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
        g_idx = torch.empty(k, dtype=torch.long)
        g_idx[perm] = torch.arange(k) // size  # inputs taken in perm's order, size of them a group
    else:
        g_idx = torch.arange(k) // size
    codes, zeros, scales = _quantize_groups(wt, g_idx, groups, bits, sym, min_zero=0 if v2 else 1)
    stored_zeros = zeros - (0 if v2 else 1)
    qweight = sum(codes.view(k // per, per, n)[:, j] << (bits * j) for j in range(per))
    qzeros = sum(stored_zeros.view(groups, n // per, per)[:, :, j] << (bits * j) for j in range(per))
    stored = {"qweight": _wrap_int32(qweight), "qzeros": _wrap_int32(qzeros), "scales": scales,
              "g_idx": g_idx.to(torch.int32)}
    return stored, _reference(codes, zeros, scales, g_idx).t().contiguous()


def awq(w: torch.Tensor, group_size: int) -> Tuple[Stored, torch.Tensor]:
    """AutoAWQ GEMM: qweight int32 [K, N / 8], qzeros int32 [G, N / 8] (8 nibbles a word in
    AWQ_PACK_ORDER), scales fp16 [G, N]; zero points asymmetric, stored as they are."""
    wt = w.t()
    k, n = wt.shape
    groups = k // group_size
    group_of_k = torch.arange(k) // group_size
    codes, zeros, scales = _quantize_groups(wt, group_of_k, groups, 4, sym=False, min_zero=0)

    def pack(x):  # [R, N] -> [R, N / 8]
        cols = x.view(x.shape[0], n // 8, 8)
        return _wrap_int32(sum(cols[:, :, AWQ_PACK_ORDER[i]] << (4 * i) for i in range(8)))

    stored = {"qweight": pack(codes), "qzeros": pack(zeros), "scales": scales}
    return stored, _reference(codes, zeros, scales, group_of_k).t().contiguous()


# ------------------------------------------------------------------ checkpoints

# case -> (quantization_config, per-weight quantizer). The skipped module (one projection
# listed as not converted, besides lm_head) checks that the lists are honoured.
SKIPPED = "model.layers.0.self_attn.o_proj"


def _cases(case: str, **opts):
    hf_skip = ["lm_head", "layers.0.self_attn.o_proj"]
    if case == "fp8_block":
        bn, bk = opts.get("block", (128, 128))
        return ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [bn, bk],
                 "modules_to_not_convert": hf_skip}, lambda w: fp8_block(w, bn, bk))
    if case == "fp8_tensor":  # vLLM / AutoFP8: a [1] weight_scale, static activation scales beside it
        return ({"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": hf_skip}, fp8_tensor_static)
    if case == "ct_fp8_channel":
        weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False}
        acts = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
        return ({"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
                 "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}},
                 "ignore": ["lm_head", r"re:.*layers[.]0[.]self_attn[.]o_proj$"], "kv_cache_scheme": None},
                lambda w: fp8_channel(w, torch.bfloat16))
    if case == "fbgemm_fp8":
        return ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": hf_skip},
                lambda w: fp8_channel(w, torch.float32))
    if case == "gptq":
        bits, group, sym = opts.get("bits", 4), opts.get("group_size", 32), opts.get("sym", True)
        desc_act, v2 = opts.get("desc_act", False), opts.get("v2", False)
        qc = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": desc_act, "sym": sym,
              "damp_percent": 0.01, "true_sequential": True, "static_groups": False,
              "checkpoint_format": "gptq_v2" if v2 else "gptq", "modules_to_not_convert": hf_skip}
        return qc, lambda w: gptq(w, bits, group, sym, desc_act, v2, seed=w.numel())
    if case == "awq":
        group = opts.get("group_size", 32)
        return ({"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm", "zero_point": True,
                 "modules_to_not_convert": hf_skip}, lambda w: awq(w, group))
    raise ValueError(case)


def _is_quantized(name: str) -> bool:
    return (name.startswith("model.layers.") and name.endswith("_proj.weight")
            and not name.startswith(SKIPPED + "."))


def _save(tensors: Dict[str, torch.Tensor], path: str, shards: int) -> None:
    """model.safetensors, or `shards` files (round robin over the names, so a module's tensors
    straddle two files) with model.safetensors.index.json."""
    if shards == 1:
        save_file(tensors, os.path.join(path, "model.safetensors"))
        return
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {name: files[i % shards] for i, name in enumerate(tensors)}
    for f in files:
        save_file({n: t for n, t in tensors.items() if weight_map[n] == f}, os.path.join(path, f))
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def write_quantized(src: str, root: str, case: str, name: Optional[str] = None, shards: int = 1,
                    **opts) -> Tuple[str, str, Dict[str, torch.Tensor]]:
    """Writes tiny checkpoint `src` quantized as `case` (fp8_block, fp8_tensor, ct_fp8_channel,
    fbgemm_fp8, gptq, awq; `opts` pick block size, bits, group size, sym, desc_act, v2) to
    root/name, and the reference (config.json without quantization_config, the exact dequantized
    weights in fp32) to root/name-ref. Returns (quantized dir, reference dir, {weight name:
    dequantized fp32} of the quantized weights)."""
    name = name or case
    qc, quantize = _cases(case, **opts)
    qdir, rdir = os.path.join(root, name), os.path.join(root, name + "-ref")
    for d in (qdir, rdir):
        os.makedirs(d, exist_ok=True)
    stored, plain, dequantized = {}, {}, {}
    for tname, t in load_file(os.path.join(src, "model.safetensors")).items():
        if not _is_quantized(tname):
            stored[tname] = plain[tname] = t
            continue
        module = tname[:-len(".weight")]
        parts, ref = quantize(t.float())
        stored.update({f"{module}.{suffix}": v.contiguous() for suffix, v in parts.items()})
        plain[tname] = dequantized[tname] = ref
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    for d, cfg, tensors, n in ((qdir, {**config, "quantization_config": qc}, stored, shards), (rdir, config, plain, 1)):
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        _save(tensors, d, n)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(src, extra)):
                shutil.copy(os.path.join(src, extra), d)
    return qdir, rdir, dequantized


def rewrite_config(path: str, dst: str, **quantization_config) -> str:
    """A copy of checkpoint `path` at dst whose quantization_config has these keys changed (None:
    removed; quant_method=None with nothing else removes quantization_config)."""
    shutil.copytree(path, dst)
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    qc = {**config.get("quantization_config", {}), **quantization_config}
    qc = {k: v for k, v in qc.items() if v is not None}
    if "quant_method" in qc:
        config["quantization_config"] = qc
    else:
        config.pop("quantization_config", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return dst
