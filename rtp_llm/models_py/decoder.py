"""One decoder-only transformer covering Qwen3 (q/k norm), Qwen2 (q/k/v bias) and Llama
(SmolLM2): GQA/MQA, tied or untied embeddings, rotary with theta and scaling. It runs on
the paged KV cache through a DeviceBackend; shapes: T tokens in the step, H heads, Hkv KV
heads, D head_dim."""

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from rtp_llm.config.model_config import ModelConfig
from rtp_llm.device.base import AttentionMetadata, DeviceBackend
from rtp_llm.models_py.rotary import cos_sin_table


@dataclass
class Layer:
    # Projection weights in the backend's layout (DeviceBackend.pack_linear), applied with
    # backend.linear; shapes below are HF's [out, in].
    input_norm: torch.Tensor
    qkv: torch.Tensor            # [(H + 2 Hkv) D, hidden]: q, k and v projections fused
    qkv_bias: Optional[torch.Tensor]
    q_norm: Optional[torch.Tensor]
    k_norm: Optional[torch.Tensor]
    o_proj: torch.Tensor         # [hidden, H D]
    post_norm: torch.Tensor
    gate_up: torch.Tensor        # [2 I, hidden]
    down: torch.Tensor           # [hidden, I]


class DecoderModel:
    def __init__(self, config: ModelConfig, weights: Dict[str, torch.Tensor], backend: DeviceBackend,
                 max_positions: int):
        self.config = c = config
        self.backend = backend
        dev = backend.device
        w = {k: v.to(dev) for k, v in weights.items()}
        pack = backend.pack_linear
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = self.embed if c.tie_word_embeddings else w["lm_head.weight"]
        self.final_norm = w["model.norm.weight"]
        self.layers: List[Layer] = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            bias = None
            if c.qkv_bias:
                bias = torch.cat([w[a + "q_proj.bias"], w[a + "k_proj.bias"], w[a + "v_proj.bias"]])
            self.layers.append(Layer(
                input_norm=w[p + "input_layernorm.weight"],
                qkv=pack(torch.cat([w[a + "q_proj.weight"], w[a + "k_proj.weight"], w[a + "v_proj.weight"]])),
                qkv_bias=bias,
                q_norm=w.get(a + "q_norm.weight"),
                k_norm=w.get(a + "k_norm.weight"),
                o_proj=pack(w[a + "o_proj.weight"]),
                post_norm=w[p + "post_attention_layernorm.weight"],
                gate_up=pack(torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])),
                down=pack(w[p + "mlp.down_proj.weight"]),
            ))
        cos, sin = cos_sin_table(c, max_positions)
        self.cos, self.sin = cos.to(dev), sin.to(dev)
        self.q_size = c.num_heads * c.head_dim
        self.kv_size = c.num_kv_heads * c.head_dim
        self.scale = c.head_dim ** -0.5

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_cache: torch.Tensor, sample_rows: Optional[torch.Tensor]) -> torch.Tensor:
        """token_ids, positions: [T]; kv_cache: [L, 2, ...]; sample_rows: [N] rows whose next
        token is wanted (None: all T). Returns logits [N, vocab] in fp32."""
        c, be = self.config, self.backend
        T = token_ids.shape[0]
        residual = self.embed[token_ids]  # [T, hidden]; every layer adds into it in place
        x = be.rms_norm(residual, self.layers[0].input_norm, c.rms_norm_eps)
        for i, layer in enumerate(self.layers):
            qkv = be.linear(x, layer.qkv)
            if layer.qkv_bias is not None:
                qkv += layer.qkv_bias
            q, k, v = be.qkv_to_cache(qkv, c.num_heads, c.num_kv_heads, c.head_dim, layer.q_norm, layer.k_norm,
                                      c.rms_norm_eps, positions, self.cos, self.sin, kv_cache[i], meta)
            o = be.attention(q, k, v, kv_cache[i], meta, self.scale)
            x = be.add_rms_norm(be.linear(o.reshape(T, self.q_size), layer.o_proj), residual, layer.post_norm,
                                c.rms_norm_eps)
            mlp = be.linear(be.silu_and_mul(be.linear(x, layer.gate_up)), layer.down)
            next_norm = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.final_norm
            x = be.add_rms_norm(mlp, residual, next_norm, c.rms_norm_eps)
        h = x if sample_rows is None else x[sample_rows]
        return F.linear(h, self.lm_head).float()
