"""Tiny DeepSeek-V2 / V3 checkpoints written as llama.cpp's `deepseek2` GGUF files, the way its
converter writes them (convert_hf_to_gguf.py: TextModel.set_gguf_parameters for the generic keys,
DeepseekV2Model.set_gguf_parameters / modify_tensors for DeepSeek's; names from gguf-py's
constants.py MODEL_TENSOR table and tensor_mapping.py's deepseek2 rows), in two of its forms:

- "legacy": the converter of early 2025 (DeepSeek-V3 support, before llama.cpp's MLA conversion):
  kv_b_proj whole as attn_kv_b, key_length / value_length the MHA head dims, head_count_kv the
  heads, expert_weights_scale / _norm and expert_gating_func always, no expert-group keys;
- "split": today's converter: kv_b_proj split per head into attn_k_b (transposed) and attn_v_b,
  key_length / value_length the latent MQA's (kvr + dr, kvr) with key_length_mla /
  value_length_mla the MHA dims, head_count_kv 1, expert_group_count / _used_count and the gating
  function from TextModel's generic keys, expert_weights_norm only when true.

Written independently of the loader (rtp_llm/model_loader/gguf_deepseek.py): these tables are
HF -> GGUF, as the converter maps, so a wrong table on either side fails the parity tests."""

import json
import os
from typing import Dict, Optional

import torch

# DeepSeek fixtures whose routing and yarn mean the same in transformers and llama.cpp (its
# graph takes yarn's mscale == mscale_all_dim, as DeepSeek's configs have; V2's routing greedy).
_BASE = dict(num_attention_heads=4, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=48,
             moe_intermediate_size=64, first_k_dense_replace=1, num_hidden_layers=3, tie_word_embeddings=False)
_YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 32, "beta_slow": 1}
GGUF_MLA = {
    # softmax greedy routing, no q LoRA, two shared experts, routed_scaling_factor 1.5, V2's yarn
    "deepseek_v2_gguf": ("DeepseekV2Config", dict(_BASE, q_lora_rank=None, n_routed_experts=7, num_experts_per_tok=2,
                                                  topk_method="greedy", n_group=None, topk_group=None,
                                                  n_shared_experts=2, routed_scaling_factor=1.5,
                                                  rope_scaling=dict(_YARN, mscale=0.707, mscale_all_dim=0.707))),
    # sigmoid + correction bias, 3 groups of 3 experts (the best 2 kept), top-3 renormalized x 2.5,
    # q LoRA, V3's yarn
    "deepseek_v3_gguf": ("DeepseekV3Config", dict(_BASE, q_lora_rank=64, n_routed_experts=9, num_experts_per_tok=3,
                                                  n_group=3, topk_group=2, n_shared_experts=1, norm_topk_prob=True,
                                                  routed_scaling_factor=2.5, rope_interleave=True,
                                                  rope_scaling=dict(_YARN, mscale=1.0, mscale_all_dim=1.0))),
}

ARCH = "deepseek2"  # gguf-py MODEL_ARCH_NAMES[MODEL_ARCH.DEEPSEEK2], for V2 and V3 alike
# HF name (under model.layers.N.) -> GGUF name (under blk.N.): tensor_mapping.py's deepseek2 rows
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
    "self_attn.k_b_proj.weight": "attn_k_b.weight",
    "self_attn.v_b_proj.weight": "attn_v_b.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    # modify_tensors renames e_score_correction_bias to e_score_correction.bias: FFN_EXP_PROBS_B + .bias
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.experts.gate_proj.weight": "ffn_gate_exps.weight",  # (the merged stacks)
    "mlp.experts.up_proj.weight": "ffn_up_exps.weight",
    "mlp.experts.down_proj.weight": "ffn_down_exps.weight",
}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}


def make_fixture(name: str, root: str) -> str:
    from rtp_llm.test.testlib import make_tiny

    return make_tiny(name, root, spec=GGUF_MLA[name])


def _metadata(c: dict, form: str) -> Dict[str, object]:
    """The deepseek2 keys (without the prefix) the converter of `form` writes for config c."""
    heads, kvr, dn, dr = c["num_attention_heads"], c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
    v3 = c["architectures"][0] == "DeepseekV3ForCausalLM"
    # (DeepSeek's published config.json carries scoring_func; transformers' saved one does not)
    scoring = c.get("scoring_func") or ("sigmoid" if v3 else "softmax")
    m = {"block_count": c["num_hidden_layers"], "context_length": c["max_position_embeddings"],
         "embedding_length": c["hidden_size"], "feed_forward_length": c["intermediate_size"],
         "attention.head_count": heads, "rope.freq_base": float((c.get("rope_parameters") or c).get("rope_theta", 1e4)),
         "attention.layer_norm_rms_epsilon": float(c["rms_norm_eps"]),
         "expert_used_count": c["num_experts_per_tok"], "leading_dense_block_count": c["first_k_dense_replace"],
         "vocab_size": c["vocab_size"], "attention.kv_lora_rank": kvr, "rope.dimension_count": dr,
         "expert_feed_forward_length": c["moe_intermediate_size"], "expert_count": c["n_routed_experts"],
         "expert_shared_count": c["n_shared_experts"], "expert_weights_scale": float(c["routed_scaling_factor"]),
         "expert_gating_func": {"softmax": 1, "sigmoid": 2}[scoring]}  # gguf.ExpertGatingFuncType
    if c.get("q_lora_rank") is not None:
        m["attention.q_lora_rank"] = c["q_lora_rank"]
    if form == "legacy":
        # (num_key_value_heads: DeepSeek's configs give it the head count)
        m.update({"attention.head_count_kv": heads, "attention.key_length": dn + dr,
                  "attention.value_length": c["v_head_dim"], "expert_weights_norm": bool(c["norm_topk_prob"])})
    else:
        m.update({"attention.head_count_kv": 1, "attention.key_length": kvr + dr, "attention.value_length": kvr,
                  "attention.key_length_mla": dn + dr, "attention.value_length_mla": c["v_head_dim"]})
        if c["norm_topk_prob"]:
            m["expert_weights_norm"] = True
        for key, hf in (("expert_group_count", "n_group"), ("expert_group_used_count", "topk_group")):
            if c.get(hf) is not None:
                m[key] = c[hf]
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type")) == "yarn":
        m.update({"rope.scaling.type": "yarn", "rope.scaling.factor": float(rope["factor"]),
                  "rope.scaling.original_context_length": rope["original_max_position_embeddings"],
                  "rope.scaling.yarn_log_multiplier": 0.1 * rope["mscale_all_dim"]})
        if form == "split":  # (TextModel writes yarn's betas where the config has them)
            m.update({"rope.scaling.yarn_beta_fast": float(rope["beta_fast"]),
                      "rope.scaling.yarn_beta_slow": float(rope["beta_slow"])})
    return m


def _tensors(hf_dir: str, c: dict, form: str) -> Dict[str, torch.Tensor]:
    """GGUF name -> tensor (HF's dimension order) as modify_tensors yields them."""
    import re

    from safetensors.torch import load_file

    hf = load_file(os.path.join(hf_dir, "model.safetensors"))
    heads, dn, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
    out, experts = {}, {}
    for name, t in hf.items():
        if name == "lm_head.weight" and c.get("tie_word_embeddings"):
            continue
        if name in _GLOBAL:
            out[_GLOBAL[name]] = t
            continue
        layer, rest = re.match(r"model\.layers\.(\d+)\.(.+)$", name).groups()
        e = re.match(r"mlp\.experts\.(\d+)\.(\w+)\.weight$", rest)
        if e:  # merged per layer: torch.stack over the expert index
            experts.setdefault((layer, e[2]), {})[int(e[1])] = t
        elif rest == "self_attn.kv_b_proj.weight" and form == "split":
            kv_b = t.view(heads, dn + dv, t.shape[-1])
            k_b, v_b = torch.split(kv_b, [dn, dv], dim=1)
            out[f"blk.{layer}.{_LAYER['self_attn.k_b_proj.weight']}"] = k_b.transpose(1, 2)
            out[f"blk.{layer}.{_LAYER['self_attn.v_b_proj.weight']}"] = v_b
        else:
            out[f"blk.{layer}.{_LAYER[rest]}"] = t
    for (layer, proj), stack in experts.items():
        out[f"blk.{layer}.{_LAYER[f'mlp.experts.{proj}.weight']}"] = torch.stack([stack[i] for i in sorted(stack)])
    return out


def _quantized(name: str, a, qtype: str):
    """(data, type) as ModelBase.prepare_tensors stores it: vectors, norms, the router and biases
    in F32; other tensors in qtype, F16 where their rows do not fill its blocks."""
    import gguf

    F32 = gguf.GGMLQuantizationType.F32
    if qtype == "F32" or a.ndim <= 1 or name.endswith(("_norm.weight", "ffn_gate_inp.weight")) or \
            not name.endswith(".weight"):
        return a, F32
    kind = gguf.GGMLQuantizationType[qtype]
    try:
        return gguf.quants.quantize(a, kind), kind
    except gguf.QuantError:
        kind = gguf.GGMLQuantizationType.F16
        return gguf.quants.quantize(a, kind), kind


def write_deepseek_gguf(hf_dir: str, path: str, form: str = "split", qtype: str = "F32",
                        edit: Optional[Dict[str, object]] = None, drop_tensors=(), vocab=None) -> str:
    """hf_dir (a make_fixture checkpoint) as a deepseek2 GGUF file at path. edit: metadata keys
    (without the deepseek2. prefix) set to new values, or removed where the value is None;
    drop_tensors: GGUF tensor name suffixes left out. vocab: (tokens by id, merges "a b") of a
    byte-level BPE, written as _set_vocab_gpt2 does (the first token the EOS); else token list
    placeholders of the vocabulary's size (pass a tokenizer_path). Returns path."""
    import gguf
    import numpy as np

    assert form in ("legacy", "split"), form
    with open(os.path.join(hf_dir, "config.json")) as f:
        c = json.load(f)
    meta = {**_metadata(c, form), **(edit or {})}
    w = gguf.GGUFWriter(path, ARCH)
    for key, value in meta.items():
        if value is None:
            continue
        add = (w.add_bool if isinstance(value, bool) else w.add_uint32 if isinstance(value, int) else
               w.add_float32 if isinstance(value, float) else w.add_string)
        add(f"{ARCH}.{key}", value)
    w.add_tokenizer_model("gpt2")
    if vocab is None:
        w.add_token_list([f"t{i}" for i in range(c["vocab_size"])])
    else:  # (the pre-tokenizer name get_vocab_base_pre gives DeepSeek's vocabularies)
        tokens, merges = vocab
        w.add_tokenizer_pre("deepseek-v3" if "V3" in c["architectures"][0] else "deepseek-llm")
        w.add_token_list(tokens)
        w.add_token_types([3 if i == 0 else 1 for i in range(len(tokens))])  # gguf.TokenType CONTROL, NORMAL
        w.add_token_merges(merges)
        w.add_eos_token_id(0)
    for name, t in _tensors(hf_dir, c, form).items():
        if name.endswith(tuple(drop_tensors)):
            continue
        data, kind = _quantized(name, np.ascontiguousarray(t.float().numpy()), qtype)
        w.add_tensor(name, data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
