"""config.json's `quantization_config`, parsed into a QuantConfig the loader acts on, or refused.

The one place that names the supported methods (SUPPORTED). Every key that changes what the
stored tensors mean is read and checked here; a value this loader cannot read exactly is a
CheckpointError naming `quantization_config.<key>`, the value, and what is supported, so no
checkpoint is ever served with ignored scales. Keys that only describe how the checkpoint was
made (damp_percent, true_sequential, observer, ...) or pick a runtime kernel (backend,
use_exllama, ...) are not read.

Every supported format is dequantized exactly at load (rtp_llm/model_loader/dequant.py); the
activation side of a format (FP8 activations, static `input_scale`) is a runtime approximation
that a dequantized-weight path does not take (docs/engine.md, "Quantized HF checkpoints")."""

import re
from dataclasses import dataclass
from typing import Optional, Tuple

from rtp_llm.model_loader.weights import CheckpointError

# quant_method -> what of it is implemented (error messages list these).
SUPPORTED = {
    "fp8": "e4m3 weights, block-wise (weight_block_size [n, k] with weight_scale_inv) or per-tensor "
           "(weight_scale_inv or weight_scale), activation_scheme dynamic or static",
    "compressed-tensors": "format float-quantized: 8-bit float weights, strategy tensor, channel or block",
    "fbgemm_fp8": "e4m3 weights with a per-channel weight_scale",
    "gptq": "bits 4 or 8, any group_size, desc_act with g_idx, sym or asym, checkpoint_format gptq or gptq_v2",
    "awq": "bits 4, version gemm, zero_point true",
}

FP8, GPTQ, AWQ = "fp8", "gptq", "awq"  # QuantConfig.kind: which tensors make a weight and which dequantizer


@dataclass(frozen=True)
class QuantConfig:
    quant_method: str                 # as config.json names it
    kind: str                         # FP8 | GPTQ | AWQ
    # FP8: how the scale spans the weight ("tensor": one value; "channel": [N, 1]; "block": [ceil(N / bn),
    # ceil(K / bk)]), the scale tensor's name suffixes (`<module>.<suffix>`, exactly one present) and the block.
    fp8_scale: str = ""
    scale_names: Tuple[str, ...] = ()
    block: Optional[Tuple[int, int]] = None   # (bn, bk): weight rows and columns per scale
    block_field: str = "weight_block_size"    # the key that gave `block` (for errors)
    # GPTQ / AWQ
    bits: int = 0
    group_size: int = -1              # input channels per group; -1: one group over all of K
    desc_act: bool = False            # GPTQ: g_idx required (groups follow the activation order)
    zero_offset: int = 0              # GPTQ v1 ("gptq") stores zero - 1: add 1 when unpacking
    # Modules (module names, e.g. "lm_head") that must be stored unquantized, the key that listed them
    # and its matching rule: "hf" transformers' should_convert_module, "ct" compressed-tensors' (exact or "re:").
    skip: Tuple[str, ...] = ()
    skip_field: str = "modules_to_not_convert"
    skip_style: str = "hf"

    def skips(self, module: str) -> bool:
        if self.skip_style == "ct":
            return any(re.match(p[3:], module) if p.startswith("re:") else p == module for p in self.skip)
        boundary = r"(?:(?<=\.)|(?=\.|$))"
        return any(re.match(rf"(?:{p}){boundary}", module) or module.endswith(p) for p in self.skip)

    def describe(self) -> str:
        if self.kind == FP8:
            how = f"block {self.block[0]}x{self.block[1]}" if self.block else f"per-{self.fp8_scale}"
            return f"{self.quant_method} (FP8 e4m3, {how})"
        order = ", desc_act" if self.desc_act else ""
        return f"{self.quant_method} ({self.bits}-bit, group_size {self.group_size}{order})"


class _Refuser:
    """Error messages for one quantization_config (its source file and method)."""

    def __init__(self, source: str, method: str):
        self.source, self.method = source, method

    def __call__(self, field: str, value, why: str = "") -> CheckpointError:
        why = f" ({why})" if why else ""
        return CheckpointError(f"{self.source}: quantization_config.{field} = {value!r} is not supported for "
                               f"quant_method {self.method!r}{why}; supported: {SUPPORTED[self.method]}")

    def require(self, qc: dict, key: str, allowed, default=None):
        value = qc.get(key, default)
        if isinstance(value, str):
            value = value.lower()
        if value not in allowed:
            raise self(key, qc.get(key, default))
        return value


def _skip_list(qc: dict, refuse: _Refuser, *keys: str) -> Tuple[Tuple[str, ...], str]:
    """The first of `keys` that is set, as (patterns, key)."""
    for key in keys:
        value = qc.get(key)
        if value is None:
            continue
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise refuse(key, value, "a list of module names is expected")
        return tuple(value), key
    return (), keys[0]


def _positive_pair(value) -> Optional[Tuple[int, int]]:
    if isinstance(value, str) and re.fullmatch(r"\d+x\d+", value):  # compressed-tensors' older "128x128"
        value = [int(v) for v in value.split("x")]
    if (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                     and v > 0 for v in value)):
        return int(value[0]), int(value[1])
    return None


def _fp8(qc: dict, refuse: _Refuser) -> QuantConfig:
    # transformers' FineGrainedFP8Config and vLLM's Fp8Config. `weight_scale_inv` is, despite its
    # name, the multiplier that dequantizes (DeepSeek-V3's convention): W = W_fp8 * weight_scale_inv.
    refuse.require(qc, "fmt", ("e4m3",), "e4m3")
    refuse.require(qc, "activation_scheme", ("dynamic", "static"), "dynamic")
    refuse.require(qc, "scale_fmt", ("float", "ue8m0", None))  # ue8m0: power-of-two scales, read as stored
    skip, key = _skip_list(qc, refuse, "modules_to_not_convert", "ignored_layers")
    common = dict(quant_method="fp8", kind=FP8, skip=skip, skip_field=key)
    if qc.get("weight_block_size") is None:
        # Per-tensor: transformers names the scalar weight_scale_inv, vLLM and AutoFP8 weight_scale.
        return QuantConfig(fp8_scale="tensor", scale_names=("weight_scale_inv", "weight_scale"), **common)
    block = _positive_pair(qc["weight_block_size"])
    if block is None:
        raise refuse("weight_block_size", qc["weight_block_size"], "two positive integers [n, k] are expected")
    return QuantConfig(fp8_scale="block", scale_names=("weight_scale_inv",), block=block, **common)


def _fbgemm_fp8(qc: dict, refuse: _Refuser) -> QuantConfig:
    # transformers' FbgemmFp8Config (Llama-3.1-405B-FP8): weight e4m3 [N, K], weight_scale fp32 [N, 1];
    # activation_scale_ub bounds the runtime activation quantization only.
    skip, key = _skip_list(qc, refuse, "modules_to_not_convert")
    return QuantConfig(quant_method="fbgemm_fp8", kind=FP8, fp8_scale="channel", scale_names=("weight_scale",),
                       skip=skip, skip_field=key)


def _compressed_tensors(qc: dict, refuse: _Refuser) -> QuantConfig:
    # compressed-tensors (llm-compressor): config_groups of {targets, weights, input_activations};
    # float-quantized stores weights e4m3 and `weight_scale` (tensor: [1] or [], channel: [N, 1],
    # block: [ceil(N / bn), ceil(K / bk)]), W = W_fp8 * weight_scale.
    for key in ("sparsity_config", "transform_config"):
        sub = qc.get(key)
        if sub and (key == "transform_config" or (sub.get("format") or "dense") != "dense"):
            raise refuse(key, sub, "sparse or transformed (rotated) weights are not read")
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise refuse("config_groups", groups, "one or more quantization groups are expected")
    specs = []
    for name, group in groups.items():
        where = f"config_groups.{name}"
        fmt = (group.get("format") or qc.get("format") or "").lower()
        if fmt != "float-quantized":
            raise refuse(f"{where}.format" if group.get("format") else "format", fmt,
                         "int8 (naive-/int-quantized), packed int4 (pack-quantized), nvfp4 and sparse formats "
                         "are not built")
        w = group.get("weights") or {}
        if w.get("type", "int") != "float" or w.get("num_bits") != 8:
            raise refuse(f"{where}.weights", {k: w.get(k) for k in ("type", "num_bits")}, "8-bit float expected")
        if not w.get("symmetric", True):
            raise refuse(f"{where}.weights.symmetric", w.get("symmetric"))
        strategy = (w.get("strategy") or "tensor").lower()
        if strategy not in ("tensor", "channel", "block"):
            raise refuse(f"{where}.weights.strategy", strategy)
        block, block_field = None, f"{where}.weights.block_structure"
        if strategy == "block":
            block = _positive_pair(w.get("block_structure"))
            if block is None:
                raise refuse(f"{where}.weights.block_structure", w.get("block_structure"))
        specs.append((strategy, block, block_field if len(groups) == 1 else "config_groups"))
    if len({spec[:2] for spec in specs}) > 1:  # groups then differ by module: their targets would have to be matched
        raise refuse("config_groups", sorted(groups), "groups with different weight schemes are not read")
    skip, key = _skip_list(qc, refuse, "ignore")
    strategy, block, block_field = specs[0]
    return QuantConfig(quant_method="compressed-tensors", kind=FP8, fp8_scale=strategy, scale_names=("weight_scale",),
                       block=block, block_field=block_field, skip=skip, skip_field=key, skip_style="ct")


def _group_size(qc: dict, refuse: _Refuser) -> int:
    g = qc.get("group_size", 128)
    if not isinstance(g, int) or isinstance(g, bool) or not (g == -1 or g > 0):
        raise refuse("group_size", g, "a positive integer or -1 is expected")
    return g


def _gptq(qc: dict, refuse: _Refuser) -> QuantConfig:
    # AutoGPTQ / GPTQModel / optimum. `checkpoint_format` (transformers also writes it as `format`):
    # "gptq" (v1) stores each zero point minus 1, "gptq_v2" stores it as is.
    if qc.get("is_marlin_format"):
        raise refuse("is_marlin_format", True, "Marlin-repacked weights are not read")
    if qc.get("dynamic"):
        raise refuse("dynamic", qc["dynamic"], "per-module overrides of bits or group size are not read")
    bits = refuse.require(qc, "bits", (4, 8))
    fmt_key = "checkpoint_format" if qc.get("checkpoint_format") is not None else "format"
    fmt = refuse.require(qc, fmt_key, ("gptq", "gptq_v2"), "gptq")
    sym = qc.get("sym", True)
    desc_act = qc.get("desc_act", False)
    for key, value in (("sym", sym), ("desc_act", desc_act)):
        if not isinstance(value, bool):
            raise refuse(key, value, "true or false expected")
    skip, key = _skip_list(qc, refuse, "modules_to_not_convert")
    return QuantConfig(quant_method="gptq", kind=GPTQ, bits=bits, group_size=_group_size(qc, refuse),
                       desc_act=desc_act, zero_offset=1 if fmt == "gptq" else 0, skip=skip, skip_field=key)


def _awq(qc: dict, refuse: _Refuser) -> QuantConfig:
    # AutoAWQ's GEMM layout (transformers' AwqConfig: `version`, newer `format`). GEMV and llm-awq
    # pack differently; zero_point false (symmetric AWQ) stores no qzeros.
    if str(qc.get("backend", "")).lower() == "llm-awq":
        raise refuse("backend", qc["backend"], "llm-awq's packing is not read")
    fmt_key = "version" if qc.get("version") is not None else "format"
    refuse.require(qc, fmt_key, ("gemm",), "gemm")
    refuse.require(qc, "bits", (4,), 4)
    refuse.require(qc, "zero_point", (True,), True)
    skip, key = _skip_list(qc, refuse, "modules_to_not_convert")
    return QuantConfig(quant_method="awq", kind=AWQ, bits=4, group_size=_group_size(qc, refuse), skip=skip,
                       skip_field=key)


_PARSERS = {"fp8": _fp8, "compressed-tensors": _compressed_tensors, "fbgemm_fp8": _fbgemm_fp8, "gptq": _gptq,
            "awq": _awq}
assert set(_PARSERS) == set(SUPPORTED)


def parse_quant_config(qc, source: str) -> Optional[QuantConfig]:
    """The QuantConfig of config.json's quantization_config (None when absent), or a
    CheckpointError naming the key at fault. `source`: the file, for the message."""
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise CheckpointError(f"{source}: quantization_config must be an object, got {qc!r}")
    method = qc.get("quant_method")
    if method not in _PARSERS:
        listed = "; ".join(f"{m} ({what})" for m, what in SUPPORTED.items())
        raise CheckpointError(f"{source}: quantization_config.quant_method = {method!r} is not supported "
                              f"(its weights would be read wrong); supported: {listed}")
    return _PARSERS[method](qc, _Refuser(source, method))
