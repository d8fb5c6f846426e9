"""The architecture of a decoder-only model, independent of the checkpoint format."""

from dataclasses import dataclass, field
from typing import List, Optional, Tuple


@dataclass
class RopeScaling:
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass
class MoeConfig:
    """Mixture-of-experts MLP (Qwen3-MoE, Qwen2-MoE): a router picks top_k of num_experts per
    token (softmax over all experts in fp32, then top-k; renormalized to sum 1 when
    norm_topk_prob); Qwen2-MoE adds a shared expert every token runs, scaled by
    sigmoid(x . shared_expert_gate)."""

    num_experts: int
    top_k: int                 # num_experts_per_tok
    intermediate_size: int     # moe_intermediate_size: each routed expert's I
    norm_topk_prob: bool = False
    shared_expert_intermediate_size: int = 0  # 0: no shared expert (Qwen3-MoE)
    decoder_sparse_step: int = 1
    mlp_only_layers: Tuple[int, ...] = ()     # layers with the dense MLP of ModelConfig.intermediate_size

    def is_sparse(self, layer: int) -> bool:
        """HF's rule (Qwen3MoeDecoderLayer / Qwen2MoeDecoderLayer): whether `layer` has the MoE MLP."""
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    def validate(self) -> None:
        if self.num_experts < 1:
            raise ValueError(f"num_experts must be at least 1, got {self.num_experts}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok ({self.top_k}) must be in [1, num_experts={self.num_experts}]")
        if self.intermediate_size < 1:
            raise ValueError(f"moe_intermediate_size must be positive, got {self.intermediate_size}")
        if self.decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step must be at least 1, got {self.decoder_sparse_step}")


@dataclass
class ModelConfig:
    model_type: str  # registry name: qwen_3, qwen_2, llama, qwen_3_moe, qwen_2_moe
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False   # Qwen3
    eos_token_ids: List[int] = field(default_factory=list)
    bos_token_id: Optional[int] = None
    moe: Optional[MoeConfig] = None  # None: every layer has the dense MLP

    def is_sparse(self, layer: int) -> bool:
        """Whether `layer`'s MLP is the MoE one (else the dense MLP of intermediate_size)."""
        return self.moe is not None and self.moe.is_sparse(layer)

    def validate(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
                             f"({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.moe is not None:
            self.moe.validate()
