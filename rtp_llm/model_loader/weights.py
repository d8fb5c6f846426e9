"""The tensors a decoder needs (HF names), and the check that a checkpoint provides them."""

from typing import Dict, Iterable, Tuple

import torch

from rtp_llm.config.model_config import ModelConfig


class CheckpointError(ValueError):
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
            p + "self_attn.q_proj.weight": (q, c.hidden_size),
            p + "self_attn.k_proj.weight": (kv, c.hidden_size),
            p + "self_attn.v_proj.weight": (kv, c.hidden_size),
            p + "self_attn.o_proj.weight": (c.hidden_size, q),
            p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
        })
        if c.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if c.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,)})
    return shapes


def check_weights(c: ModelConfig, weights: Dict[str, torch.Tensor], source: str) -> None:
    expected = expected_weights(c)
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
