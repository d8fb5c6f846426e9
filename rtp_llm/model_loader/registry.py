"""Supported model families: upstream's --model_type names and the HF/GGUF names they cover."""

from typing import Dict, Optional

# model_type -> architecture traits that differ between families.
MODEL_TYPES: Dict[str, dict] = {
    "qwen_3": {"qkv_bias": False, "qk_norm": True},
    "qwen_2": {"qkv_bias": True, "qk_norm": False},
    "llama": {"qkv_bias": False, "qk_norm": False},
}

# config.json "architectures" / GGUF general.architecture -> model_type
_ALIASES = {
    "Qwen3ForCausalLM": "qwen_3",
    "Qwen2ForCausalLM": "qwen_2",
    "LlamaForCausalLM": "llama",
    "qwen3": "qwen_3",
    "qwen2": "qwen_2",
    "llama": "llama",
    "qwen_3": "qwen_3",
    "qwen_2": "qwen_2",
    "qwen2_5": "qwen_2",
    "qwen_2_5": "qwen_2",
}


class UnsupportedModelError(ValueError):
    pass


def resolve_model_type(requested: Optional[str], detected: Optional[str], source: str) -> str:
    """The registry name from --model_type, else from what the checkpoint says it is."""
    name = requested or detected
    if name is None:
        raise UnsupportedModelError(f"cannot tell the model type of {source}: pass --model_type "
                                    f"(supported: {', '.join(MODEL_TYPES)})")
    model_type = _ALIASES.get(name)
    if model_type is None:
        raise UnsupportedModelError(f"unsupported model type {name!r} ({source}); supported: "
                                    f"{', '.join(MODEL_TYPES)} (HF: Qwen3ForCausalLM, Qwen2ForCausalLM, "
                                    f"LlamaForCausalLM)")
    return model_type
