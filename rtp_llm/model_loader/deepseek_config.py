"""DeepSeek-V2 / V3 (and Kimi-K2, V3.1: DeepseekV3ForCausalLM) fields of config.json: the latent
attention (MlaConfig) and the routing of its mixture of experts (MoeConfig), with the semantics
of transformers' modeling_deepseek_v2 / v3 (the parity reference). What transformers and
DeepSeek's own modeling code read differently is refused naming the field, so a checkpoint is
never run with a meaning that one of them would not give it."""

from typing import Optional

from rtp_llm.config.model_config import MlaConfig, MoeConfig
from rtp_llm.model_loader.weights import CheckpointError


# transformers' config class defaults for the keys a config.json may leave out (DeepseekV2Config,
# DeepseekV3Config): what the reference runs with when a key is absent.
_DEFAULTS = {
    "deepseek2": {"routed_scaling_factor": 1.0, "n_shared_experts": 2, "first_k_dense_replace": 0,
                  "topk_method": "greedy", "n_group": None, "topk_group": None},
    "deepseek3": {"routed_scaling_factor": 2.5, "n_shared_experts": 1, "first_k_dense_replace": 3,
                  "norm_topk_prob": True, "n_group": 8, "topk_group": 4},
}


def _required(cfg: dict, key: str, path: str, what: str) -> int:
    if cfg.get(key) is None:
        raise CheckpointError(f"{path}: {key} is missing ({what} needs it)")
    return int(cfg[key])


def _refuse_unless(cfg: dict, key: str, allowed, path: str, why: str) -> None:
    value = cfg.get(key)
    if value is not None and value not in allowed:
        raise CheckpointError(f"{path}: {key}={value!r} is not supported ({why})")


def mla_config(cfg: dict, model_type: str, path: str) -> MlaConfig:
    """Multi-head latent attention. V2's rotary always takes interleaved pairs (transformers'
    complex rotation); V3's when rope_interleave (default true)."""
    what = "multi-head latent attention"
    _refuse_unless(cfg, "attention_bias", (False,), path, "DeepSeek checkpoints have no attention biases")
    _refuse_unless(cfg, "mlp_bias", (False,), path, "DeepSeek checkpoints have no MLP biases")
    _refuse_unless(cfg, "hidden_act", ("silu",), path, "the MLPs run SiLU")
    q_lora = cfg.get("q_lora_rank")
    return MlaConfig(kv_lora_rank=_required(cfg, "kv_lora_rank", path, what),
                     qk_nope_head_dim=_required(cfg, "qk_nope_head_dim", path, what),
                     qk_rope_head_dim=_required(cfg, "qk_rope_head_dim", path, what),
                     v_head_dim=_required(cfg, "v_head_dim", path, what),
                     q_lora_rank=None if q_lora is None else int(q_lora),
                     rope_interleave=True if model_type == "deepseek2" else bool(cfg.get("rope_interleave", True)))


def deepseek_moe(cfg: dict, model_type: str, path: str) -> Optional[MoeConfig]:
    """The routed and shared experts. V2 routes by topk_method (greedy or group_limited_greedy,
    softmax scores); V3 always by noaux_tc (sigmoid scores plus e_score_correction_bias,
    groups ranked by their two best), as transformers does. The first first_k_dense_replace
    layers keep the dense MLP of intermediate_size."""
    what = "a DeepSeek mixture of experts"
    cfg = {**_DEFAULTS[model_type], **{k: v for k, v in cfg.items() if v is not None}}
    experts = cfg.get("n_routed_experts", cfg.get("num_local_experts", cfg.get("num_experts")))
    if experts is None:
        raise CheckpointError(f"{path}: n_routed_experts is missing ({what} needs it)")
    # DeepSeek's code makes layer i sparse when i >= first_k_dense_replace and i % moe_layer_freq
    # == 0; transformers ignores moe_layer_freq. Every published checkpoint has 1.
    _refuse_unless(cfg, "moe_layer_freq", (1,), path, "only 1, where transformers and DeepSeek's code agree")
    if model_type == "deepseek2":
        _refuse_unless(cfg, "scoring_func", ("softmax",), path, "DeepSeek-V2 routes by softmax scores")
        routing = cfg.get("topk_method") or "greedy"
        if routing not in ("greedy", "group_limited_greedy"):
            raise CheckpointError(f"{path}: topk_method={routing!r} is not supported for deepseek2 (greedy, "
                                  f"group_limited_greedy are)")
        # transformers' V2 router never renormalizes, DeepSeek's code does when this is true.
        _refuse_unless(cfg, "norm_topk_prob", (False,), path, "transformers' DeepSeek-V2 ignores it")
        norm = False
    else:
        _refuse_unless(cfg, "scoring_func", ("sigmoid",), path, "DeepSeek-V3 routes by sigmoid scores")
        _refuse_unless(cfg, "topk_method", ("noaux_tc",), path, "DeepSeek-V3 routes by noaux_tc")
        routing, norm = "noaux_tc", bool(cfg["norm_topk_prob"])
    grouped = routing != "greedy"
    inter = _required(cfg, "moe_intermediate_size", path, what)
    shared = int(cfg["n_shared_experts"] or 0)
    return MoeConfig(num_experts=int(experts), top_k=_required(cfg, "num_experts_per_tok", path, what),
                     intermediate_size=inter, norm_topk_prob=norm,
                     shared_expert_intermediate_size=inter * shared,
                     mlp_only_layers=tuple(range(int(cfg["first_k_dense_replace"] or 0))),
                     routing=routing,
                     n_group=_required(cfg, "n_group", path, routing) if grouped else 1,
                     topk_group=_required(cfg, "topk_group", path, routing) if grouped else 1,
                     routed_scaling_factor=float(cfg["routed_scaling_factor"]),
                     shared_expert_gate=False)
