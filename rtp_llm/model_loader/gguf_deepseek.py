"""DeepSeek-V2 / V3 GGUF files: llama.cpp's `deepseek2` architecture (DeepSeek-V2, V2-Lite, V2.5,
V3, R1, V3.1, Kimi-K2 as published in GGUF), read into the HF names and the config that our
DeepSeek model takes (deepseek_config.py's MlaConfig / MoeConfig, models_py/mla.py, moe.py).

A file means what llama.cpp computes from it: its converter (convert_hf_to_gguf.py,
DeepseekV2Model.set_gguf_parameters / modify_tensors, and TextModel.set_gguf_parameters for the
generic keys), its loader (llama_model_deepseek2::load_arch_hparams / load_arch_tensors, formerly
llm_load_hparams' LLM_ARCH_DEEPSEEK2 case) and its graph (src/models/deepseek2.cpp,
llm_graph_context::build_moe_ffn in src/llama-graph.cpp, llama_context's yarn set-up):

- Tensors keep HF's row order: the converter permutes no q/k rows for deepseek2, and
  llama_model_rope_type gives it LLAMA_ROPE_TYPE_NORM (consecutive pairs rotate together), which
  is HF's interleaved rope: MlaConfig.rope_interleave, whatever the source config said.
- kv_b_proj: files written before llama.cpp's MLA conversion (PR 12801) hold it whole,
  attn_kv_b [H (dn + dv), kvr] as HF; later ones split it per head (modify_tensors): attn_k_b
  [H, kvr, dn] (the key half, transposed) and attn_v_b [H, dv, kvr]. Merged back exactly.
- Head dims: attention.key_length_mla / value_length_mla where present (such files describe the
  latent MQA with key_length = kvr + dr, value_length = kvr, head_count_kv = 1), else
  key_length / value_length (dn + dr and dv).
- Routing (build_moe_ffn): expert_gating_func (absent: softmax, load_arch_hparams' fallback for V2
  files); the selection adds exp_probs_b (V3's e_score_correction_bias); expert_group_count > 1
  keeps the expert_group_used_count groups whose two best selection scores sum highest (V3's
  noaux_tc rule; read for every architecture by llm_load_hparams); the weights are the unbiased
  scores of the chosen, divided by their sum under expert_weights_norm, times
  expert_weights_scale (absent or 0: 1). Files without group keys route over all experts, as
  llama.cpp runs them, also where the source model grouped them (V3 files of early 2025).
- YaRN: rope.scaling.yarn_log_multiplier is 0.1 x mscale_all_dim (the converter's factor, divided
  back by load_arch_hparams: [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]); the softmax scale is
  mscale(factor, mscale_all_dim)^2 / sqrt(dn + dr) (deepseek2.cpp's kq_scale), and cos / sin stay
  unscaled (llama_context takes mscale == mscale_all_dim for deepseek2: attention factor 1).

What llama.cpp would run differently from our model is refused by name (CheckpointError):
softmax gating with a selection bias, with groups, or renormalized (our V2 router is HF's greedy);
other gating functions; an RMS-norm eps other than 1e-6 (llama.cpp uses the file's eps in the
q / kv LoRA norms too, transformers and our model 1e-6); YaRN without the log multiplier, or
with an extrapolation factor; rope scaling other than YaRN; attention temperature scaling;
multi-token-prediction layers; fused gate-up expert stacks."""

import math
from typing import Callable, Dict, Iterable, List, Tuple

import torch

from rtp_llm.config.model_config import MlaConfig, MoeConfig, RopeScaling
from rtp_llm.model_loader.gguf_moe import EXPERT_STACKS, split_experts
from rtp_llm.model_loader.weights import CheckpointError, fp32_weights

ARCH = "deepseek2"
_SOFTMAX, _SIGMOID = 1, 2        # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_{SOFTMAX,SIGMOID}
_YARN_LOG_MUL_SCALE = 0.1        # the converter writes 0.1 x mscale_all_dim
_LORA_NORM_EPS = 1e-6            # models_py/mla.py's LORA_NORM_EPS (transformers' RMSNorm default)

# A deepseek2 file's layer tensor -> its HF name under model.layers.N. (gguf-py's tensor_mapping
# deepseek2 rows). The layer norms, attn_output and the dense layers' ffn_{gate,up,down} are
# gguf_loader's common names (they may stay quantized); these are widened (the latent
# projections are absorbed, the router routes in fp32, the shared experts are stacked with cat).
LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",            # no q LoRA (V2-Lite)
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",      # files before the split
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
_KV_B_HALVES = ("attn_k_b.weight", "attn_v_b.weight")
_REFUSED_TENSORS = {"ffn_gate_up_exps.weight": "fused gate-up expert stacks are not split yet"}


class _Fields:
    """The file's metadata under deepseek2's prefix; need() refuses a missing key by name."""

    def __init__(self, field: Callable, path: str):
        self.field, self.path = field, path

    def get(self, key: str, default=None):
        value = self.field(f"{ARCH}.{key}")
        return default if value is None else value

    def need(self, key: str):
        value = self.field(f"{ARCH}.{key}")
        if value is None:
            raise CheckpointError(f"{self.path}: {ARCH}.{key} is missing (a deepseek2 GGUF needs it)")
        return value

    def refuse(self, key: str, why: str):
        raise CheckpointError(f"{self.path}: {ARCH}.{key}={self.field(f'{ARCH}.{key}')!r} is not supported ({why})")


def deepseek_config_fields(field: Callable, shapes: Dict[str, tuple], num_layers: int, path: str) -> dict:
    """ModelConfig's fields of a deepseek2 file: field(key) its metadata (None when absent),
    shapes its tensors' (HF order). V3's sigmoid routing makes it model_type deepseek3."""
    f = _Fields(field, path)
    eps = float(f.need("attention.layer_norm_rms_epsilon"))
    if not math.isclose(eps, _LORA_NORM_EPS, rel_tol=1e-5):
        f.refuse("attention.layer_norm_rms_epsilon", "llama.cpp applies it to the q/kv LoRA norms too, where "
                 "transformers and this model use 1e-6")
    if int(f.get("nextn_predict_layers", 0)):
        f.refuse("nextn_predict_layers", "multi-token-prediction layers are not run")
    if float(f.get("attention.temperature_scale", 0.0)):
        f.refuse("attention.temperature_scale", "attention temperature tuning is not implemented")
    heads = int(f.need("attention.head_count"))
    mla = _mla(f, shapes)
    moe = _moe(f, shapes, num_layers)
    dense = moe.mlp_only_layers
    return dict(model_type="deepseek3" if moe.routing == "noaux_tc" else "deepseek2", num_heads=heads,
                num_kv_heads=heads, head_dim=mla.qk_rope_head_dim, mla=mla, moe=moe, rope_scaling=_rope(f),
                intermediate_size=int(f.need("feed_forward_length") if dense else f.get("feed_forward_length", 0)),
                rms_norm_eps=eps)


def _mla(f: _Fields, shapes: Dict[str, tuple]) -> MlaConfig:
    dr = int(f.need("rope.dimension_count"))
    if f.get("attention.key_length_mla") is not None or f.get("attention.value_length_mla") is not None:
        dk, dv = int(f.need("attention.key_length_mla")), int(f.need("attention.value_length_mla"))
    else:  # (a file from before the MLA split: the MHA head dims)
        dk, dv = int(f.need("attention.key_length")), int(f.need("attention.value_length"))
    if dk <= dr:
        raise CheckpointError(f"{f.path}: key length {dk} leaves no no-rope dims beside "
                              f"{ARCH}.rope.dimension_count={dr}")
    # llama.cpp's graph takes the q LoRA path where the layer has attn_q_a (deepseek2.cpp's is_lite)
    q_lora = int(f.need("attention.q_lora_rank")) if "blk.0.attn_q_a.weight" in shapes else None
    return MlaConfig(kv_lora_rank=int(f.need("attention.kv_lora_rank")), qk_nope_head_dim=dk - dr,
                     qk_rope_head_dim=dr, v_head_dim=dv, q_lora_rank=q_lora, rope_interleave=True)


def _moe(f: _Fields, shapes: Dict[str, tuple], num_layers: int) -> MoeConfig:
    """build_moe_ffn's routing as our routers run it: softmax -> greedy (HF's DeepseekV2 router),
    sigmoid -> noaux_tc (HF's DeepseekV3 router; no exp_probs_b: a zero bias, finish())."""
    experts, inter = int(f.need("expert_count")), int(f.need("expert_feed_forward_length"))
    gating = int(f.get("expert_gating_func", _SOFTMAX))
    norm = bool(f.get("expert_weights_norm", False))
    groups, biased = int(f.get("expert_group_count", 1)), any(n.endswith(".exp_probs_b.bias") for n in shapes)
    grouped = groups > 1 and int(f.need("expert_group_used_count")) < groups
    if gating == _SOFTMAX:
        if biased:
            raise CheckpointError(f"{f.path}: softmax gating ({ARCH}.expert_gating_func="
                                  f"{f.get('expert_gating_func', 'absent')}) with exp_probs_b selection biases is not "
                                  f"supported (V3's correction bias goes with sigmoid gating)")
        if grouped:
            f.refuse("expert_group_count", "llama.cpp ranks softmax groups by their two best scores, DeepSeek-V2's "
                     "group_limited_greedy by their best: not implemented")
        if norm:
            f.refuse("expert_weights_norm", "the softmax (DeepSeek-V2) router does not renormalize")
        routing = "greedy"
    elif gating == _SIGMOID:
        routing = "noaux_tc"
    else:
        f.refuse("expert_gating_func", "softmax (1) and sigmoid (2) are")
    lead = int(f.get("leading_dense_block_count", 0))
    if not 0 <= lead < num_layers:
        f.refuse("leading_dense_block_count", f"the file has {num_layers} blocks")
    scale = float(f.get("expert_weights_scale", 0.0)) or 1.0  # (absent or 0: build_moe_ffn scales by nothing)
    return MoeConfig(num_experts=experts, top_k=int(f.need("expert_used_count")), intermediate_size=inter,
                     norm_topk_prob=norm, shared_expert_intermediate_size=inter * int(f.need("expert_shared_count")),
                     mlp_only_layers=tuple(range(lead)), routing=routing,
                     n_group=groups if grouped else 1,
                     topk_group=int(f.need("expert_group_used_count")) if grouped else 1,
                     routed_scaling_factor=scale, shared_expert_gate=False)


def _rope(f: _Fields) -> RopeScaling:
    kind = f.get("rope.scaling.type", "none")
    if kind == "none":
        return RopeScaling()
    if kind != "yarn":
        f.refuse("rope.scaling.type", "deepseek2 files are read with yarn or none")
    log_mul = float(f.get("rope.scaling.yarn_log_multiplier", 0.0))
    if not log_mul:  # llama.cpp then scales cos / sin and the softmax otherwise than transformers
        raise CheckpointError(f"{f.path}: yarn without {ARCH}.rope.scaling.yarn_log_multiplier is not supported "
                              f"(DeepSeek's mscale_all_dim)")
    if float(f.get("rope.scaling.yarn_ext_factor", 1.0)) != 1.0:
        f.refuse("rope.scaling.yarn_ext_factor", "yarn blends its ramp whole")
    m = log_mul / _YARN_LOG_MUL_SCALE
    return RopeScaling(kind="yarn", factor=float(f.need("rope.scaling.factor")),
                       original_max_position=int(f.need("rope.scaling.original_context_length")),
                       beta_fast=float(f.get("rope.scaling.yarn_beta_fast", 32.0)),
                       beta_slow=float(f.get("rope.scaling.yarn_beta_slow", 1.0)),
                       mscale=m, mscale_all_dim=m, attention_factor=1.0, truncate=True)


class DeepseekTensors:
    """A deepseek2 file's layer tensors as HF (name, tensor) pairs, widened (fp32 from the file)
    and cast to the run dtype, except the router and its bias, kept fp32 (weights.fp32_weights).
    attn_k_b / attn_v_b wait for each other and become kv_b_proj; finish() refuses a half left
    over and gives noaux_tc layers without exp_probs_b their zero bias (llama.cpp selects by the
    plain sigmoid scores there)."""

    def __init__(self, config, dtype: torch.dtype, path: str):
        self.config, self.dtype, self.path = config, dtype, path
        self.halves: Dict[int, Dict[str, torch.Tensor]] = {}
        self.biased = set()

    @staticmethod
    def takes(rest: str) -> bool:
        return rest in LAYER_NAMES or rest in EXPERT_STACKS or rest in _KV_B_HALVES or rest in _REFUSED_TENSORS

    def convert(self, layer: int, rest: str, tensor: torch.Tensor) -> List[Tuple[str, torch.Tensor]]:
        """tensor: blk.{layer}.{rest} widened to fp32 in HF's dimension order."""
        if rest in _REFUSED_TENSORS:
            raise CheckpointError(f"{self.path}: tensor blk.{layer}.{rest} is not supported ({_REFUSED_TENSORS[rest]})")
        if rest in EXPERT_STACKS:
            return list(split_experts(str(layer), rest, tensor.to(self.dtype)))
        if rest in _KV_B_HALVES:
            halves = self.halves.setdefault(layer, {})
            halves[rest] = tensor
            if len(halves) < 2:
                return []
            del self.halves[layer]
            tensor, rest = self._merge(layer, halves), "attn_kv_b.weight"
        if rest == "exp_probs_b.bias":
            self.biased.add(layer)
        name = f"model.layers.{layer}.{LAYER_NAMES[rest]}"
        return [(name, tensor if fp32_weights(self.config, name) else tensor.to(self.dtype))]

    def _merge(self, layer: int, halves: Dict[str, torch.Tensor]) -> torch.Tensor:
        """kv_b_proj [H (dn + dv), kvr]: per head its key rows (k_b [H, kvr, dn], transposed
        back) then its value rows (v_b [H, dv, kvr]), as DeepseekV2Model.modify_tensors split them."""
        m, heads = self.config.mla, self.config.num_heads
        dn, dv, kvr = m.qk_nope_head_dim, m.v_head_dim, m.kv_lora_rank
        k_b, v_b = halves["attn_k_b.weight"], halves["attn_v_b.weight"]
        for rest, t, want in (("attn_k_b", k_b, (heads, kvr, dn)), ("attn_v_b", v_b, (heads, dv, kvr))):
            if tuple(t.shape) != want:
                raise CheckpointError(f"{self.path}: tensor blk.{layer}.{rest}.weight has shape {tuple(t.shape)}, "
                                      f"expected {want} from the metadata")
        return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(heads * (dn + dv), kvr)

    def finish(self) -> Iterable[Tuple[str, torch.Tensor]]:
        for layer, halves in sorted(self.halves.items()):
            have = next(iter(halves))
            other = next(h for h in _KV_B_HALVES if h != have)
            raise CheckpointError(f"{self.path}: blk.{layer}.{other} is missing (blk.{layer}.{have} is half of "
                                  f"kv_b_proj)")
        c = self.config
        if c.moe.routing != "noaux_tc":
            return []
        return [(f"model.layers.{i}.mlp.gate.e_score_correction_bias", torch.zeros(c.moe.num_experts))
                for i in range(c.num_layers) if c.is_sparse(i) and i not in self.biased]
