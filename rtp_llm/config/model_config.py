"""The architecture of a decoder-only model, independent of the checkpoint format."""

from dataclasses import dataclass, field
import math
from typing import List, Optional, Tuple

# --load_format: where the weights come from. "auto": the checkpoint's files; "dummy": random
# weights of its config.json's shapes, for benchmarks (model_loader/dummy.py).
LOAD_FORMATS = ("auto", "dummy")


class ModelRefused(ValueError):
    """A model or checkpoint this server will not serve as asked; the message names the field,
    flag or tensor at fault. The backend reports it in one line (no traceback: it is the user's
    input, not a bug) and exits with REFUSED_EXIT, which the launcher passes on."""


REFUSED_EXIT = 2


@dataclass
class RopeScaling:
    kind: str = "default"  # default | linear | llama3 | yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    # yarn (DeepSeek-V2/V3): transformers' _compute_yarn_parameters. attention_factor multiplies
    # cos and sin (None: derived from factor, mscale and mscale_all_dim); mscale_all_dim also
    # scales DeepSeek's softmax (MlaConfig.softmax_scale).
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    attention_factor: Optional[float] = None
    truncate: bool = True


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction (transformers' get_mscale / yarn_get_mscale)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass
class MlaConfig:
    """DeepSeek-V2/V3 multi-head latent attention. Per token and layer the KV cache holds the
    compressed latent (kv_lora_rank, after kv_a_layernorm) and the one rotary key shared by all
    heads (qk_rope_head_dim); kv_b_proj expands the latent into each head's no-rope key
    (qk_nope_head_dim) and value (v_head_dim). q_lora_rank None: a plain q_proj."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: Optional[int] = None
    # The rope dims of q and k_pe come in interleaved pairs (x0, x1), (x2, x3) ... (V2 always,
    # V3 when rope_interleave): the loader permutes those weight rows to rotate_half's halves.
    rope_interleave: bool = True

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Elements per token and layer in the cache: the latent, then the rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def softmax_scale(self, rope: RopeScaling) -> float:
        """transformers' yarn_apply_mscale: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2
        under a scaled rope whose mscale_all_dim is set."""
        scale = self.qk_head_dim ** -0.5
        if rope.kind != "default" and rope.mscale_all_dim:
            m = yarn_mscale(rope.factor, rope.mscale_all_dim)
            scale *= m * m
        return scale

    def validate(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even for rotary embeddings, got {self.qk_rope_head_dim}")
        if self.q_lora_rank is not None and self.q_lora_rank < 1:
            raise ValueError(f"q_lora_rank must be positive or null, got {self.q_lora_rank}")


# MoeConfig.routing: how the router's scores pick top_k experts (models_py/moe.py, route()).
ROUTINGS = ("softmax",               # Qwen3-MoE / Qwen2-MoE: softmax in fp32, top-k, optional renormalizing
            "greedy",                # DeepSeek-V2: softmax in fp32, top-k, x routed_scaling_factor
            "group_limited_greedy",  # DeepSeek-V2: the top-k within the topk_group best groups (by max)
            "noaux_tc")              # DeepSeek-V3: sigmoid + e_score_correction_bias, groups by top-2 sums


@dataclass
class MoeConfig:
    """Mixture-of-experts MLP (Qwen3-MoE, Qwen2-MoE, DeepSeek-V2/V3): a router picks top_k of
    num_experts per token (`routing`, ROUTINGS); Qwen2-MoE adds a shared expert every token runs,
    scaled by sigmoid(x . shared_expert_gate), DeepSeek ungated shared experts (one dense MLP of
    n_shared_experts x moe_intermediate_size)."""

    num_experts: int
    top_k: int                 # num_experts_per_tok
    intermediate_size: int     # moe_intermediate_size: each routed expert's I
    norm_topk_prob: bool = False
    shared_expert_intermediate_size: int = 0  # 0: no shared expert (Qwen3-MoE)
    decoder_sparse_step: int = 1
    mlp_only_layers: Tuple[int, ...] = ()     # layers with the dense MLP of ModelConfig.intermediate_size
    routing: str = "softmax"                  # one of ROUTINGS
    n_group: int = 1                          # grouped routing: experts in n_group equal groups,
    topk_group: int = 1                       # the top-k taken from the topk_group best
    routed_scaling_factor: float = 1.0        # DeepSeek: multiplies the routing weights
    shared_expert_gate: bool = True           # Qwen2-MoE's sigmoid gate (DeepSeek: none)

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
        if self.routing not in ROUTINGS:
            raise ValueError(f"topk_method {self.routing!r} is not supported ({', '.join(ROUTINGS[1:])} are)")
        if self.routing in ("group_limited_greedy", "noaux_tc"):
            if self.n_group < 1 or self.num_experts % self.n_group:
                raise ValueError(f"n_group ({self.n_group}) must divide n_routed_experts ({self.num_experts})")
            if not 1 <= self.topk_group <= self.n_group:
                raise ValueError(f"topk_group ({self.topk_group}) must be in [1, n_group={self.n_group}]")
            if self.routing == "noaux_tc" and self.num_experts // self.n_group < 2:
                raise ValueError(f"n_group ({self.n_group}) leaves fewer than 2 experts per group (noaux_tc scores a "
                                 f"group by its top 2)")
            if self.top_k > self.topk_group * (self.num_experts // self.n_group):
                raise ValueError(f"num_experts_per_tok ({self.top_k}) exceeds the experts of topk_group "
                                 f"({self.topk_group}) groups")


@dataclass
class ModelConfig:
    model_type: str  # registry name: qwen_3, qwen_2, llama, qwen_3_moe, qwen_2_moe, deepseek2, deepseek3
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
    # DeepSeek's latent attention (None: GQA/MHA with q/k/v projections); head_dim is then its
    # qk_rope_head_dim (the rotary tables' width) and num_kv_heads unused.
    mla: Optional[MlaConfig] = None

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
        if self.mla is not None:
            self.mla.validate()
