"""HF checkpoints: config.json, generation_config.json and single or sharded *.safetensors,
unquantized or quantized (quant_config.py, dequant.py)."""

import json
import os
from contextlib import ExitStack
from typing import Callable, Dict, Iterable, List, Optional

import torch
from safetensors import safe_open
from tqdm import tqdm

from rtp_llm.config.model_config import ModelConfig, MoeConfig, RopeScaling
from rtp_llm.model_loader.deepseek_config import deepseek_moe, mla_config
from rtp_llm.model_loader.dequant import PACKED_SUFFIXES, check_plain, read_linear
from rtp_llm.model_loader.fp8_weight import Fp8Tensor
from rtp_llm.model_loader.int_weight import GroupIntTensor
from rtp_llm.model_loader.quant_config import QuantConfig, parse_quant_config
from rtp_llm.model_loader.quantized import kept_projection
from rtp_llm.model_loader.registry import MODEL_TYPES, resolve_model_type
from rtp_llm.model_loader.weights import (CheckpointError, check_weights, expected_weights, fp32_weights,
                                          pack_experts)


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e


def _as_list(value) -> List[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _rope(cfg: dict, name: str) -> tuple:
    params = dict(cfg.get("rope_parameters") or {})  # transformers 5 moves rope settings here
    scaling = cfg.get("rope_scaling") or params
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default")) or "default"
    if kind not in ("default", "linear", "llama3", "yarn"):
        raise CheckpointError(f"rope scaling type {kind!r} is not supported (default, linear, llama3, yarn are)")
    rs = RopeScaling(kind=kind)
    if kind in ("linear", "llama3"):
        rs.factor = float(scaling["factor"])
    if kind == "llama3":
        rs.low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
        rs.high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
        rs.original_max_position = int(scaling.get("original_max_position_embeddings", 8192))
    if kind == "yarn":
        if not MODEL_TYPES[name]["mla"]:  # (tested against transformers on DeepSeek's latent attention only)
            raise CheckpointError(f"rope scaling type 'yarn' is supported for deepseek2 and deepseek3 only, not "
                                  f"{name}")
        _yarn(rs, scaling, cfg)
    return theta, rs


def _yarn(rs: RopeScaling, scaling: dict, cfg: dict) -> None:
    """YaRN's settings as transformers reads them (standardize_rope_params and
    _compute_yarn_parameters): original_max_position_embeddings from the top level first, then
    the rope dict, else max_position_embeddings; a missing factor is max / original; beta_fast
    and beta_slow fall back to 32 and 1 when absent or 0."""
    original = cfg.get("original_max_position_embeddings", scaling.get("original_max_position_embeddings"))
    rs.original_max_position = int(original or cfg.get("max_position_embeddings", 4096))
    factor = scaling.get("factor")
    rs.factor = float(factor) if factor is not None else cfg.get("max_position_embeddings", 4096) / rs.original_max_position
    rs.beta_fast = float(scaling.get("beta_fast") or 32)
    rs.beta_slow = float(scaling.get("beta_slow") or 1)
    rs.mscale = float(scaling.get("mscale") or 0)
    rs.mscale_all_dim = float(scaling.get("mscale_all_dim") or 0)
    af = scaling.get("attention_factor")
    rs.attention_factor = float(af) if af is not None else None
    rs.truncate = bool(scaling.get("truncate", True))


def _moe(cfg: dict, name: str, path: str) -> Optional[MoeConfig]:
    """Qwen3-MoE / Qwen2-MoE fields of config.json (None for a dense family); DeepSeek's in
    deepseek_config.py."""
    traits = MODEL_TYPES[name]
    if not traits["moe"]:
        return None
    if traits["mla"]:
        return deepseek_moe(cfg, name, path)
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))  # transformers 5 writes num_local_experts
    for key, value in (("num_experts", experts), ("num_experts_per_tok", cfg.get("num_experts_per_tok")),
                       ("moe_intermediate_size", cfg.get("moe_intermediate_size"))):
        if value is None:
            raise CheckpointError(f"{path}: {key} is missing (a mixture-of-experts config needs it)")
    shared = int(cfg.get("shared_expert_intermediate_size") or 0) if traits["shared_expert"] else 0
    if traits["shared_expert"] and not shared:
        raise CheckpointError(f"{path}: shared_expert_intermediate_size is missing or 0 (Qwen2-MoE has a shared "
                              f"expert)")
    return MoeConfig(num_experts=int(experts), top_k=int(cfg["num_experts_per_tok"]),
                     intermediate_size=int(cfg["moe_intermediate_size"]),
                     norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                     shared_expert_intermediate_size=shared,
                     decoder_sparse_step=int(cfg.get("decoder_sparse_step") or 1),
                     mlp_only_layers=tuple(int(i) for i in cfg.get("mlp_only_layers") or ()))


def read_hf_config(checkpoint_path: str, model_type: Optional[str] = None) -> ModelConfig:
    path = os.path.join(checkpoint_path, "config.json")
    if not os.path.exists(path):
        raise CheckpointError(f"{checkpoint_path} has no config.json (an HF checkpoint directory or a .gguf file "
                              f"is expected)")
    cfg = _read_json(path)
    archs = cfg.get("architectures") or []
    name = resolve_model_type(model_type, archs[0] if archs else cfg.get("model_type"), path)
    traits = MODEL_TYPES[name]
    heads = int(cfg["num_attention_heads"])
    mla = mla_config(cfg, name, path) if traits["mla"] else None
    theta, scaling = _rope(cfg, name)
    gen_path = os.path.join(checkpoint_path, "generation_config.json")
    gen = _read_json(gen_path) if os.path.exists(gen_path) else {}
    eos = _as_list(gen.get("eos_token_id")) or _as_list(cfg.get("eos_token_id"))
    config = ModelConfig(
        model_type=name,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=heads if mla else int(cfg.get("num_key_value_heads") or heads),
        head_dim=mla.qk_rope_head_dim if mla else int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        intermediate_size=int(cfg["intermediate_size"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        # Qwen2-MoE's config says qkv_bias (transformers 5; True when absent, as published)
        qkv_bias=bool(cfg.get("qkv_bias", traits["qkv_bias"])) or bool(cfg.get("attention_bias", False)),
        qk_norm=traits["qk_norm"],
        eos_token_ids=eos,
        bos_token_id=gen.get("bos_token_id", cfg.get("bos_token_id")),
        moe=_moe(cfg, name, path),
        mla=mla,
    )
    config.validate()
    read_quant_config(checkpoint_path)  # at start-up: a quantization this loader cannot read is refused now
    return config


def _shards(checkpoint_path: str) -> List[str]:
    index = os.path.join(checkpoint_path, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(_read_json(index)["weight_map"].values()))
        missing = [f for f in files if not os.path.exists(os.path.join(checkpoint_path, f))]
        if missing:
            raise CheckpointError(f"{index} names shard {missing[0]}, which is missing")
        return [os.path.join(checkpoint_path, f) for f in files]
    single = os.path.join(checkpoint_path, "model.safetensors")
    if os.path.exists(single):
        return [single]
    found = sorted(f for f in os.listdir(checkpoint_path) if f.endswith(".safetensors"))
    if not found:
        raise CheckpointError(f"{checkpoint_path} has no *.safetensors weights")
    return [os.path.join(checkpoint_path, f) for f in found]


class _ShardIndex:
    """Every tensor of the checkpoint by name, in the files' order, read on demand from its
    shard: safe_open maps the files and copies a tensor out only when it is read, so a weight
    whose tensors (qweight, qzeros, scales ...) straddle two shards is read whole, and nothing
    but the weight being converted is held besides the result."""

    def __init__(self, paths: List[str], stack: ExitStack):
        self.where: Dict[str, str] = {}
        self.files = {}
        for path in paths:
            try:
                self.files[path] = stack.enter_context(safe_open(path, framework="pt"))
                names = list(self.files[path].keys())
            except Exception as e:  # safetensors' errors on a truncated or corrupt file
                raise CheckpointError(f"cannot read {path}: {e}") from e
            for name in names:
                self.where.setdefault(name, path)

        self.stored: Dict[str, str] = {}  # a name -> the tensor's own name in its file, where they differ

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str) -> torch.Tensor:
        try:
            return self.files[self.where[name]].get_tensor(self.stored.get(name, name))
        except Exception as e:
            raise CheckpointError(f"cannot read {name} from {self.where[name]}: {e}") from e

    def renamed(self, names: Dict[str, str]) -> "_ShardIndex":
        """A view holding only the tensors `names` maps to (new name -> name here), under the new names."""
        view = _ShardIndex([], ExitStack())
        view.files = self.files
        view.where = {new: self.where[old] for new, old in names.items() if old in self.where}
        view.stored = {new: self.stored.get(old, old) for new, old in names.items() if old in self.where}
        return view


def same_or_absent(checkpoint_path: str, pairs: Dict[str, str], chunk_rows: int = 8192) -> List[str]:
    """The keys of `pairs` (a tensor's name -> the name of a copy of it) whose copy is absent from
    the checkpoint or holds the same values: dtype and shape, then chunks of rows (a table of
    gigabytes is never held whole)."""
    out = []
    with ExitStack() as stack:
        index = _ShardIndex(_shards(checkpoint_path), stack)
        for name, copy in pairs.items():
            if copy not in index:
                out.append(name)
                continue
            if name not in index:
                continue
            a, b = (index.files[index.where[n]].get_slice(index.stored.get(n, n)) for n in (name, copy))
            shape = a.get_shape()
            if a.get_dtype() != b.get_dtype() or shape != b.get_shape():
                continue
            if not shape:
                same = torch.equal(index.get(name), index.get(copy))
            else:
                same = all(torch.equal(a[i:i + chunk_rows], b[i:i + chunk_rows]) for i in range(0, shape[0], chunk_rows))
            if same:
                out.append(name)
    return out


def read_quant_config(checkpoint_path: str) -> Optional[QuantConfig]:
    """config.json's quantization_config, parsed and checked (quant_config.py); None when the
    checkpoint is not quantized. A quantize_config.json / quant_config.json beside a config.json
    without one (older AutoGPTQ / AutoAWQ exports) is refused: its tensors would not be read right."""
    path = os.path.join(checkpoint_path, "config.json")
    qc = _read_json(path).get("quantization_config")
    if qc is None:
        for other in ("quantize_config.json", "quant_config.json"):
            if os.path.exists(os.path.join(checkpoint_path, other)):
                raise CheckpointError(f"{checkpoint_path} has {other} but config.json has no quantization_config: "
                                      f"copy its settings into config.json as quantization_config (with quant_method)")
    return parse_quant_config(qc, path)


def _load_order(index: _ShardIndex, wanted: Dict[str, tuple]) -> List[str]:
    """The wanted weights the checkpoint has, in the order their (first) tensors are stored; a
    quantized weight (`<m>.qweight`, ...) counts as `<m>.weight`, once."""
    order = {}
    for name in index.where:
        if name not in wanted:
            module, _, suffix = name.rpartition(".")
            name = module + ".weight" if suffix in PACKED_SUFFIXES else None
        if name in wanted:
            order[name] = None
    return list(order)


def _kept_for(config: ModelConfig, name: str, dtype: torch.dtype) -> Optional[torch.dtype]:
    """The run dtype a packed weight `name` (FP8, GPTQ, AWQ) is kept for (read_linear's keep), or
    None: widened now."""
    return dtype if kept_projection(config, name) else None


def load_hf_weights(checkpoint_path: str, config: ModelConfig, dtype: torch.dtype,
                    progress: bool = True,
                    select: Optional[Callable[[List[str]], Dict[str, str]]] = None,
                    extra: Optional[Dict[str, tuple]] = None, omit: Iterable[str] = ()) -> Dict[str, torch.Tensor]:
    """The model's weights in the run dtype, one at a time: a quantized linear weight is
    dequantized exactly (dequant.py) and rounded to `dtype` before the next is read, except an
    FP8, GPTQ or AWQ projection, which stays packed (Fp8Tensor, GroupIntTensor: the decoder widens
    it the same way for a backend without kernels for it). select: the checkpoint's tensor names ->
    {the model's name: the checkpoint's} for a model stored under other names (a layer of another
    model: models_py/mtp.py); the names of `config`'s model that it gives no tensor for are
    missing. extra: more tensors read besides the model's (name -> shape), checked likewise. omit:
    tensors of the model not read (the caller has them: an MTP layer's copy of the model's table)."""
    qc = read_quant_config(checkpoint_path)
    omit = set(omit)
    wanted = {**{n: s for n, s in expected_weights(config).items() if n not in omit}, **(extra or {})}
    weights: Dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        index = _ShardIndex(_shards(checkpoint_path), stack)
        if select is not None:
            index = index.renamed(select(list(index.where)))
        order = _load_order(index, wanted)
        bar = tqdm(total=len(wanted), desc="loading weights", unit="tensor", disable=not progress)
        for name in order:
            if len(wanted[name]) == 2 and name.endswith(".weight"):
                w = read_linear(index, qc, name[:-len(".weight")], wanted[name], _kept_for(config, name, dtype))
            else:
                w = check_plain(name, index.get(name), qc)
            if not isinstance(w, (Fp8Tensor, GroupIntTensor)):  # (these dequantize to dtype already)
                w = w.to(torch.float32 if fp32_weights(config, name) else dtype)
            weights[name] = w
            bar.update(1)
        bar.close()
    if config.tie_word_embeddings and "lm_head.weight" in weights:
        del weights["lm_head.weight"]
    check_weights(config, weights, checkpoint_path, omit)
    for name, shape in (extra or {}).items():
        if name not in weights or tuple(weights[name].shape) != shape:
            raise CheckpointError(f"{checkpoint_path}: tensor {name} is missing or not of shape {shape}")
    pack_experts(config, weights)
    return weights
