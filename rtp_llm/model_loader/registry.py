"""Supported model families: upstream's --model_type names and the HF/GGUF names they cover."""

from typing import Dict, Optional

from rtp_llm.config.model_config import ModelRefused

# model_type -> architecture traits that differ between families ("moe": the MLP of some layers
# is a mixture of experts, config.json's num_experts / moe_intermediate_size ...; "shared_expert":
# those layers also run Qwen2-MoE's gated shared expert; "mla": DeepSeek's multi-head latent
# attention, grouped routing and ungated shared experts, model_loader/deepseek_config.py).
_DENSE = {"qkv_bias": False, "qk_norm": False, "moe": False, "shared_expert": False, "mla": False}
MODEL_TYPES: Dict[str, dict] = {
    "qwen_3": dict(_DENSE, qk_norm=True),
    "qwen_2": dict(_DENSE, qkv_bias=True),
    "llama": dict(_DENSE),
    "qwen_3_moe": dict(_DENSE, qk_norm=True, moe=True),
    "qwen_2_moe": dict(_DENSE, qkv_bias=True, moe=True, shared_expert=True),
    "deepseek2": dict(_DENSE, moe=True, mla=True),
    "deepseek3": dict(_DENSE, moe=True, mla=True),
}

# config.json "architectures" / GGUF general.architecture -> model_type
_ALIASES = {
    "Qwen3ForCausalLM": "qwen_3",
    "Qwen2ForCausalLM": "qwen_2",
    "LlamaForCausalLM": "llama",
    "Qwen3MoeForCausalLM": "qwen_3_moe",
    "Qwen2MoeForCausalLM": "qwen_2_moe",
    "qwen3": "qwen_3",
    "qwen2": "qwen_2",
    "llama": "llama",
    "qwen3moe": "qwen_3_moe",  # GGUF names (gguf_moe.py)
    "qwen2moe": "qwen_2_moe",
    "qwen_3": "qwen_3",
    "qwen_2": "qwen_2",
    "qwen2_5": "qwen_2",
    "qwen_2_5": "qwen_2",
    "qwen_3_moe": "qwen_3_moe",
    "qwen3_coder_moe": "qwen_3_moe",  # upstream's name for Qwen3-Coder (Qwen3MoeForCausalLM)
    "qwen_2_moe": "qwen_2_moe",
    "DeepseekV2ForCausalLM": "deepseek2",
    "DeepseekV3ForCausalLM": "deepseek3",  # also Kimi-K2's architecture
    "deepseek2": "deepseek2",  # (also llama.cpp's GGUF name for V2 and V3: gguf_deepseek.py tells them apart)
    "deepseek3": "deepseek3",
    "deepseek_v2": "deepseek2",
    "deepseek_v3": "deepseek3",
    "kimi_k2": "deepseek3",     # upstream's names for DeepseekV3ForCausalLM checkpoints
    "deepseek_v31": "deepseek3",
}

# Architectures known and not built yet: refused with what they are.
_NOT_YET: Dict[str, str] = {
    "DeepseekV32ForCausalLM": "DeepSeek-V3.2 (sparse attention over the latent cache)",
    "deepseek_v32": "DeepSeek-V3.2 (sparse attention over the latent cache)",
}

_HF_NAMES = ("Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM, Qwen3MoeForCausalLM, "
             "Qwen2MoeForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM")


class UnsupportedModelError(ModelRefused):
    """A model type, or a model with a flag, that is not implemented (names which)."""


def resolve_model_type(requested: Optional[str], detected: Optional[str], source: str) -> str:
    """The registry name from --model_type, else from what the checkpoint says it is."""
    name = requested or detected
    if name is None:
        raise UnsupportedModelError(f"cannot tell the model type of {source}: pass --model_type "
                                    f"(supported: {', '.join(MODEL_TYPES)})")
    if name in _NOT_YET:
        raise UnsupportedModelError(f"model type {name!r} ({source}) is {_NOT_YET[name]}, which is not supported "
                                    f"yet; supported: {', '.join(MODEL_TYPES)} (HF: {_HF_NAMES})")
    model_type = _ALIASES.get(name)
    if model_type is None:
        raise UnsupportedModelError(f"unsupported model type {name!r} ({source}); supported: "
                                    f"{', '.join(MODEL_TYPES)} (HF: {_HF_NAMES})")
    return model_type
