"""The tensors a decoder needs (HF names, as published), the check that a checkpoint provides
them, and the packing of a MoE layer's per-expert tensors into stacks."""

import math
import re
from typing import Dict, Iterable, Tuple

import torch

from rtp_llm.config.model_config import ModelConfig, ModelRefused


class CheckpointError(ModelRefused):
    """A checkpoint that does not fit the model: names the file or tensor at fault."""


def expected_weights(c: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size), "model.norm.weight": (c.hidden_size,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (c.hidden_size,),
            p + "post_attention_layernorm.weight": (c.hidden_size,),
        })
        if c.mla is not None:
            shapes.update(_mla_weights(c, p + "self_attn."))
        else:
            shapes.update({
                p + "self_attn.q_proj.weight": (q, c.hidden_size),
                p + "self_attn.k_proj.weight": (kv, c.hidden_size),
                p + "self_attn.v_proj.weight": (kv, c.hidden_size),
                p + "self_attn.o_proj.weight": (c.hidden_size, q),
            })
        mlp = _moe_weights(c, i) if c.is_sparse(i) else _mlp_weights(p + "mlp.", c.intermediate_size, c.hidden_size)
        shapes.update(mlp)
        if c.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if c.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,)})
    return shapes


_ROUTED = re.compile(r"\.mlp\.experts\.\d+\.")


def active_elements(c: ModelConfig, lm_head: bool = True) -> int:
    """Weight elements one token computes with: every expected tensor but the embedding (one row
    of it is read) and, of the routed experts, top_k of num_experts; without the LM head when
    lm_head is False (a prompt token that is not sampled). x2: its matmul FLOPs; x bytes per
    element: the weight bytes a decoded token reads."""
    total = 0
    for name, shape in expected_weights(c).items():
        if name == "model.embed_tokens.weight" or (name == "lm_head.weight" and not lm_head):
            continue
        n = math.prod(shape)
        total += n * c.moe.top_k // c.moe.num_experts if _ROUTED.search(name) else n
    if lm_head and c.tie_word_embeddings:
        total += c.vocab_size * c.hidden_size  # the embedding, read again as the LM head
    return total


def _mla_weights(c: ModelConfig, a: str) -> Dict[str, Tuple[int, ...]]:
    """DeepSeek's latent attention (HF names as published), [out, in]."""
    m, h, heads = c.mla, c.hidden_size, c.num_heads
    shapes = {a + "kv_a_proj_with_mqa.weight": (m.kv_lora_rank + m.qk_rope_head_dim, h),
              a + "kv_a_layernorm.weight": (m.kv_lora_rank,),
              a + "kv_b_proj.weight": (heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
              a + "o_proj.weight": (h, heads * m.v_head_dim)}
    if m.q_lora_rank is None:
        shapes[a + "q_proj.weight"] = (heads * m.qk_head_dim, h)
    else:
        shapes.update({a + "q_a_proj.weight": (m.q_lora_rank, h), a + "q_a_layernorm.weight": (m.q_lora_rank,),
                       a + "q_b_proj.weight": (heads * m.qk_head_dim, m.q_lora_rank)})
    return shapes


def _mlp_weights(p: str, inter: int, hidden: int) -> Dict[str, Tuple[int, ...]]:
    return {p + "gate_proj.weight": (inter, hidden), p + "up_proj.weight": (inter, hidden),
            p + "down_proj.weight": (hidden, inter)}


def expert_name(layer: int, expert: int, proj: str) -> str:
    """A routed expert's published tensor name (proj: gate_proj, up_proj, down_proj)."""
    return f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"


# The stacks pack_experts() makes of a sparse layer's experts (transformers 5's in-memory names):
# GATE_UP [E, 2 I, hidden] (each expert's gate rows, then its up rows), DOWN [E, hidden, I].
GATE_UP, DOWN = "mlp.experts.gate_up_proj", "mlp.experts.down_proj"


def _moe_weights(c: ModelConfig, layer: int) -> Dict[str, Tuple[int, ...]]:
    m, h, p = c.moe, c.hidden_size, f"model.layers.{layer}."
    shapes = {p + "mlp.gate.weight": (m.num_experts, h)}  # the router
    if m.routing == "noaux_tc":
        shapes[p + "mlp.gate.e_score_correction_bias"] = (m.num_experts,)
    for e in range(m.num_experts):
        shapes.update({expert_name(layer, e, "gate_proj"): (m.intermediate_size, h),
                       expert_name(layer, e, "up_proj"): (m.intermediate_size, h),
                       expert_name(layer, e, "down_proj"): (h, m.intermediate_size)})
    if m.shared_expert_intermediate_size:
        shapes.update(_mlp_weights(p + shared_expert_prefix(m), m.shared_expert_intermediate_size, h))
        if m.shared_expert_gate:
            shapes[p + "mlp.shared_expert_gate.weight"] = (1, h)
    return shapes


def shared_expert_prefix(m) -> str:
    """Where a layer's shared expert MLP is published: Qwen2-MoE's one gated shared_expert,
    DeepSeek's ungated shared_experts (one MLP of their summed width)."""
    return "mlp.shared_expert." if m.shared_expert_gate else "mlp.shared_experts."


def fp32_weights(c: ModelConfig, name: str) -> bool:
    """Whether `name` stays fp32 in any run dtype: DeepSeek's router and its score correction
    bias, which transformers keeps in fp32 (_keep_in_fp32_modules_strict) and routes with."""
    return c.mla is not None and (name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias"))


def pack_experts(c: ModelConfig, weights: Dict[str, torch.Tensor]) -> None:
    """In place, after check_weights: each sparse layer's per-expert tensors become its two
    stacks (GATE_UP, DOWN); one layer at a time, so the peak is the weights plus one layer's
    experts."""
    for i in range(c.num_layers):
        if not c.is_sparse(i):
            continue
        p = f"model.layers.{i}."
        experts = range(c.moe.num_experts)
        weights[p + GATE_UP] = torch.stack([torch.cat([weights.pop(expert_name(i, e, "gate_proj")),
                                                       weights.pop(expert_name(i, e, "up_proj"))]) for e in experts])
        weights[p + DOWN] = torch.stack([weights.pop(expert_name(i, e, "down_proj")) for e in experts])


def check_weights(c: ModelConfig, weights: Dict[str, torch.Tensor], source: str, omit: Iterable[str] = ()) -> None:
    """Every tensor of c's model present in `weights` with its shape, but those in `omit` (the
    caller provides them otherwise)."""
    omit = set(omit)
    expected = {n: s for n, s in expected_weights(c).items() if n not in omit}
    missing = [n for n in expected if n not in weights]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{source}: missing tensor {missing[0]}{more} for model_type {c.model_type}")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise CheckpointError(f"{source}: tensor {name} has shape {tuple(weights[name].shape)}, "
                                  f"expected {shape} from the model config")


def keep_expected(c: ModelConfig, named: Iterable[Tuple[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    expected = expected_weights(c)
    return {n: t for n, t in named if n in expected}
