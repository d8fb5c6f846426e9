"""Mixture-of-experts GGUF files (llama.cpp's qwen3moe and qwen2moe): the router's config from the
metadata, and each layer's stacked expert tensors, [E, rows, cols] as llama.cpp stores them
(ffn_gate_exps, ffn_up_exps, ffn_down_exps), split into the per-expert HF names that check_weights
and pack_experts take. Experts are widened to the run dtype: no backend computes on quantized
expert stacks, so they are held (and counted by the memory check) at the run dtype's size.

llama.cpp's semantics are the reference where the file is silent: its qwen3moe graph normalizes
the top-k routing weights and its qwen2moe graph does not (build_moe_ffn's norm_w), every layer
with expert tensors is sparse, and gating is a softmax."""

from typing import Callable, Dict, Iterable, Optional, Tuple

import torch

from rtp_llm.config.model_config import MoeConfig
from rtp_llm.model_loader.weights import CheckpointError, expert_name

# GGUF layer tensor -> the HF projection each expert's slice becomes
EXPERT_STACKS = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
                 "ffn_down_exps.weight": "down_proj"}
# GGUF layer tensor -> HF name under model.layers.N. (the router, Qwen2-MoE's gated shared expert)
MOE_LAYER_NAMES = {
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",  # [H] in the file, HF's [1, H]
}
_NORM_TOPK = {"qwen_3_moe": True, "qwen_2_moe": False}  # llama.cpp's build_moe_ffn norm_w
_SOFTMAX_GATING = 1  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX


def gguf_moe(field: Callable, arch: str, model_type: str, tensors: Dict[str, Tuple[int, ...]], num_layers: int,
             shared_expert: bool, path: str) -> MoeConfig:
    """The MoeConfig of a qwen3moe / qwen2moe file. field(key, default): its metadata; tensors:
    name -> shape (HF order, rows first)."""
    def need(key: str) -> int:
        value = field(f"{arch}.{key}")
        if value is None:
            raise CheckpointError(f"{path}: {arch}.{key} is missing (a mixture-of-experts GGUF needs it)")
        return int(value)

    gating = field(f"{arch}.expert_gating_func")
    if gating is not None and int(gating) != _SOFTMAX_GATING:
        raise CheckpointError(f"{path}: {arch}.expert_gating_func={gating} is not supported for {model_type} "
                              f"(softmax routing only)")
    sparse = {i for i in range(num_layers) if f"blk.{i}.ffn_gate_exps.weight" in tensors}
    if not sparse:
        raise CheckpointError(f"{path}: no layer has expert tensors (blk.N.ffn_gate_exps.weight) for {model_type}")
    shared = 0
    if shared_expert:
        shared = int(field(f"{arch}.expert_shared_feed_forward_length") or 0)
        if not shared:  # (older files: the width of the shared expert's tensors)
            shape = tensors.get(f"blk.{min(sparse)}.ffn_gate_shexp.weight")
            if shape is None:
                raise CheckpointError(f"{path}: {model_type} has a shared expert, but the file has neither "
                                      f"{arch}.expert_shared_feed_forward_length nor ffn_gate_shexp tensors")
            shared = shape[0]
    norm = field(f"{arch}.expert_weights_norm")
    return MoeConfig(num_experts=need("expert_count"), top_k=need("expert_used_count"),
                     intermediate_size=need("expert_feed_forward_length"),
                     norm_topk_prob=_NORM_TOPK[model_type] if norm is None else bool(norm),
                     shared_expert_intermediate_size=shared,
                     mlp_only_layers=tuple(i for i in range(num_layers) if i not in sparse))


def split_experts(layer: str, rest: str, stack: torch.Tensor) -> Iterable[Tuple[str, torch.Tensor]]:
    """(HF name, tensor) of each expert of one stacked [E, rows, cols] tensor (views of it)."""
    proj = EXPERT_STACKS[rest]
    return ((expert_name(int(layer), e, proj), stack[e]) for e in range(stack.shape[0]))


def moe_layer_tensor(layer: str, rest: str, tensor: torch.Tensor) -> Optional[Tuple[str, torch.Tensor]]:
    """(HF name, tensor) of a router or shared-expert tensor, None for anything else."""
    name = MOE_LAYER_NAMES.get(rest)
    if name is None:
        return None
    if rest == "ffn_gate_inp_shexp.weight":
        tensor = tensor.reshape(1, -1)
    return f"model.layers.{layer}.{name}", tensor
