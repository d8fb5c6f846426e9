"""--quantization (upstream's flag; its --int8_mode=1 is the same as int8): the schemes that
quantize a checkpoint's weights at load (model_loader/quantize_at_load.py does it), what each
means and the devices that compute on it. check() refuses the rest, naming the flag, before
anything loads. And --kv_cache_dtype (vLLM's name): the KV cache's element type, likewise."""

from typing import Optional

# --quantization value -> (what it is, the devices that compute on it)
SCHEMES = {"int8": ("weight-only int8: on the CPU fp16 scales per 32 inputs (GGUF Q8_0 blocks), on CUDA one "
                    "scale per output row", ("cpu", "cuda")),
           "fp8": ("FP8 e4m3 weights, one scale per output row; activations quantized per row at run time "
                   "(Hopper GPUs)", ("cuda",))}


def scheme(quantization: Optional[str], int8_mode: int = 0) -> Optional[str]:
    """The normalized scheme of the flags (upstream writes INT8), or None for none."""
    value = (quantization or "").strip().lower()
    if int8_mode and not value:
        value = "int8"
    return value or None


def check(quantization: Optional[str], device: str, act_type: str) -> None:
    """Refuses, naming the flag, a scheme we do not have or cannot run on `device`."""
    if quantization is None:
        return
    if quantization not in SCHEMES:
        raise ValueError(f"--quantization={quantization} is not supported; supported: "
                         f"{', '.join(f'{k} ({v[0]})' for k, v in SCHEMES.items())}. Pre-quantized checkpoints "
                         f"(FP8, GPTQ, AWQ, GGUF) load by their own format without the flag")
    devices = SCHEMES[quantization][1]
    if device not in devices:
        raise ValueError(f"--quantization={quantization} runs on --device={'/'.join(devices)} only for now; "
                         f"--device={device} has no kernels for it yet")
    if act_type in ("fp32", "float32") or (quantization == "fp8" and act_type in ("fp16", "float16")):
        raise ValueError(f"--quantization={quantization} needs --act_type=bf16 (its kernels take bf16 "
                         f"activations), got --act_type={act_type}")


# --kv_cache_dtype value -> (what it is, the devices whose attention reads it; None: every device).
KV_CACHE_DTYPES = {"auto": ("the run dtype", None),
                   "fp8": ("e4m3 with scale 1, saturated at +-448: half of bf16's bytes a token", ("cuda",)),
                   "fp8_e4m3": ("the same as fp8", ("cuda",))}


def check_kv_cache_dtype(name: str, device: str) -> None:
    """Refuses, naming the flag, a KV cache dtype we do not have or cannot read on `device`."""
    if name not in KV_CACHE_DTYPES:
        choices = ", ".join(f"{k} ({v[0]})" for k, v in KV_CACHE_DTYPES.items())
        raise ValueError(f"--kv_cache_dtype must be one of {choices}, got {name!r}")
    devices = KV_CACHE_DTYPES[name][1]
    if devices is not None and device not in devices:
        raise ValueError(f"--kv_cache_dtype={name} runs on --device={'/'.join(devices)} only; --device={device} "
                         f"has no attention kernels for it yet")
