"""Writes a quantized copy of a bf16 / fp16 / fp32 HF checkpoint, as published checkpoints of the
format store it, for benchmarks and tests (ours and vLLM's read the same files):

    python -m rtp_llm.tools.quantize --src DIR --out DIR [--scheme block|channel|gptq]

- block (default; Qwen3-*-FP8 and DeepSeek-V3's format): `quant_method` fp8, `weight_block_size`
  [128, 128], per block of 128 x 128 weights an fp32 `weight_scale_inv` (its max |w| / 448, the
  multiplier), dynamic activation scales;
- channel (compressed-tensors' float-quantized format, as llm-compressor's FP8_DYNAMIC writes):
  one scale per output row, `weight_scale` [N, 1];
- gptq (AutoGPTQ's format, `checkpoint_format` gptq): 4-bit codes in groups of 128 inputs,
  symmetric (zero point 8, stored as 7), fp16 scales (2 max |w| / 15 of the group), rounded to
  nearest: GPTQ's layout without its error-compensating updates (which change only the codes'
  values: the same kernels run them).

Quantized: the decoder layers' projections (`*_proj.weight` under model.layers, MoE experts
included); the embedding, LM head, norms and routers are copied as they are. Runs on the GPU
when there is one (an 8B model in seconds), else on the CPU."""

import argparse
import json
import os
import shutil
from typing import Dict, Optional, Tuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rtp_llm.model_loader.fp8_weight import E4M3_MAX, quantize_per_row

BLOCK = (128, 128)
GPTQ_GROUP = 128
SHARD_BYTES = 4 << 30
SCHEMES = ("block", "channel", "gptq")


def _is_quantized(name: str) -> bool:
    return name.startswith("model.layers.") and name.endswith("_proj.weight")


def quantize_block(w: torch.Tensor, block: Tuple[int, int] = BLOCK) -> Tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (e4m3 [N, K], fp32 scales [ceil(N / bn), ceil(K / bk)]), w ~ codes x its block's
    scale (edge blocks partial; an all-zero block's scale is 1)."""
    n, k = w.shape
    bn, bk = block
    gn, gk = -(-n // bn), -(-k // bk)
    padded = torch.zeros(gn * bn, gk * bk, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w
    blocks = padded.view(gn, bn, gk, bk)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    codes = (blocks / scale[:, None, :, None]).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes.view(gn * bn, gk * bk)[:n, :k].contiguous(), scale


def quantize_channel(w: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (e4m3 [N, K], fp32 scales [N, 1]): one scale per output row (as
    --quantization=fp8 quantizes at load)."""
    t = quantize_per_row(w, torch.float32)
    return t.blocks, t.scale


def _int32(words: torch.Tensor) -> torch.Tensor:
    return ((words + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32)


def quantize_gptq(w: torch.Tensor, bits: int = 4, group: int = GPTQ_GROUP,
                  act_order: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
    """w [N, K] -> GPTQ v1's tensors (suffix -> tensor): qweight int32 [K * bits / 32, N] (codes
    along K, low bits first), qzeros int32 [G, N * bits / 32] (zero - 1, along N), scales fp16
    [G, N], g_idx int32 [K]. Symmetric, rounded to nearest; act_order (a permutation of the
    inputs, desc_act's) takes the inputs in that order, `group` of them a group."""
    n, k = w.shape
    per, maxq = 32 // bits, (1 << bits) - 1
    groups = -(-k // group)
    order = torch.arange(k, device=w.device) if act_order is None else act_order.to(w.device)
    wt = torch.zeros(groups * group, n, dtype=torch.float32, device=w.device)
    wt[:k] = w.t().float()[order]                                   # [K, N] in act order
    wg = wt.view(groups, group, n)
    scale = (2 * wg.abs().amax(dim=1) / maxq).half()                 # [G, N]
    safe = torch.where(scale > 0, scale.float(), torch.ones_like(scale, dtype=torch.float32))
    zero = 1 << (bits - 1)
    q = (torch.round(wg / safe[:, None]) + zero).clamp_(0, maxq).to(torch.int64).view(-1, n)[:k]
    codes = torch.empty_like(q)
    codes[order] = q                                                  # back to input order
    g_idx = torch.empty(k, dtype=torch.int32, device=w.device)
    g_idx[order] = (torch.arange(k, device=w.device) // group).to(torch.int32)
    qweight = sum(codes.view(k // per, per, n)[:, j] << (bits * j) for j in range(per))
    zeros = torch.full((groups, n // per), 0, dtype=torch.int64, device=w.device)
    for j in range(per):
        zeros |= (zero - 1) << (bits * j)
    return {"qweight": _int32(qweight), "qzeros": _int32(zeros), "scales": scale, "g_idx": g_idx}


def quantization_config(scheme: str) -> dict:
    if scheme == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": GPTQ_GROUP, "desc_act": False, "sym": True,
                "checkpoint_format": "gptq"}
    if scheme == "block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(BLOCK)}
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False}
    acts = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}},
            "ignore": ["lm_head"]}


def _tensors(src: str):
    """(name, tensor) of every *.safetensors file of src, in file order."""
    for f in sorted(x for x in os.listdir(src) if x.endswith(".safetensors")):
        with safe_open(os.path.join(src, f), "pt") as st:
            for name in st.keys():
                yield name, st.get_tensor(name)


def _quantized(name: str, w: torch.Tensor, scheme: str) -> Dict[str, torch.Tensor]:
    """The tensors that store weight `name` in `scheme`, by name."""
    module = name[:-len(".weight")]
    if scheme == "gptq":
        return {f"{module}.{suffix}": t for suffix, t in quantize_gptq(w).items()}
    codes, scale = quantize_block(w) if scheme == "block" else quantize_channel(w)
    return {name: codes, f"{module}.{'weight_scale_inv' if scheme == 'block' else 'weight_scale'}": scale}


def write(src: str, out: str, scheme: str = "block") -> str:
    """src's checkpoint quantized to out (its config.json with a quantization_config, its other
    files copied). Returns out."""
    if scheme not in SCHEMES:
        raise ValueError(f"--scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    if "quantization_config" in config:
        raise ValueError(f"{src} is already quantized ({config['quantization_config'].get('quant_method')})")
    os.makedirs(out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shard: Dict[str, torch.Tensor] = {}
    files, weight_map, size = [], {}, 0

    def flush():
        nonlocal shard, size
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, os.path.join(out, name), metadata={"format": "pt"})
        weight_map.update({t: name for t in shard})
        files.append(name)
        shard, size = {}, 0

    for name, t in _tensors(src):
        if _is_quantized(name) and t.dim() == 2:
            parts = _quantized(name, t.to(dev, torch.float32), scheme)
        else:
            parts = {name: t}
        for n, v in parts.items():
            shard[n] = v.cpu().contiguous()
            size += v.numel() * v.element_size()
        if size >= SHARD_BYTES:
            flush()
    if shard:
        flush()
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({**config, "quantization_config": quantization_config(scheme)}, f, indent=1)
    for name in os.listdir(src):
        if not name.endswith(".safetensors") and name not in ("config.json", "model.safetensors.index.json"):
            path = os.path.join(src, name)
            if os.path.isfile(path):
                shutil.copy(path, out)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", required=True, help="an HF checkpoint directory (bf16, fp16 or fp32)")
    p.add_argument("--out", required=True)
    p.add_argument("--scheme", choices=SCHEMES, default="block")
    a = p.parse_args()
    print(write(a.src, a.out, a.scheme))


if __name__ == "__main__":
    main()
