"""An EAGLE-3 draft head (--sp_type=eagle3; vLLM's and SGLang's `eagle3`): one Llama decoder layer
trained to predict the target's next tokens from the target's own hidden states, so a draft costs
one layer and a small LM head instead of a draft model's whole forward.

At position i the head reads the token after it, t_{i+1}, and a hidden state g_i: for rows fed by
the target, g_i = fc(aux_i), aux_i [3 Ht] the target's residual stream entering its layers
`aux_layers` (DecoderModel.aux); for a draft's own next row, the head's previous output h (H wide,
before its final norm). Then (shapes per row; H the head's width, the target's embedding width):

    x = [rmsnorm(embed(t_{i+1})), rmsnorm(g)]       [2 H]  (the q/k/v projections take 2 H)
    h = g + o_proj(attention(x))                    (rope at position i, the head's own KV cache)
    h = h + mlp(rmsnorm(h))
    draft = d2t[argmax(lm_head(rmsnorm(h)))]        (the head's vocabulary, mapped to the target's)

The checkpoint is as published (yuhuili/EAGLE3-*, AngelSlim/*_eagle3, SpecForge's output):
config.json (LlamaForCausalLMEagle3, draft_vocab_size, optionally eagle_config's
eagle_aux_hidden_state_layer_ids) and `midlayer.*`, `fc`, `norm`, `lm_head`, `d2t` tensors; the
token embedding is the target's unless the head has its own `embed_tokens`."""

import glob
import json
import os
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

import torch

from rtp_llm.config.model_config import ModelConfig
from rtp_llm.device.base import AttentionMetadata, DeviceBackend, KVCacheSpec
from rtp_llm.model_loader.hf_loader import read_hf_config
from rtp_llm.model_loader.weights import CheckpointError
from rtp_llm.models_py.rotary import cos_sin_table

_MIDLAYER = ("input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
             "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def default_aux_layers(num_layers: int) -> Tuple[int, ...]:
    """The target layers whose inputs an EAGLE-3 head reads when its config names none: an early,
    the middle and a late one (vLLM's and SGLang's choice, which published heads were trained on)."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass
class Eagle3Config:
    model: ModelConfig          # the head's one Llama layer (num_layers 1)
    draft_vocab_size: int
    aux_layers: Tuple[int, ...]  # target layers whose input residual streams feed fc
    target_hidden_size: int


def read_eagle3_config(path: str, target: ModelConfig) -> Eagle3Config:
    """The head at `path` checked against the target it drafts for (errors name the field)."""
    raw_path = os.path.join(path, "config.json")
    if not os.path.exists(raw_path):
        raise CheckpointError(f"--sp_checkpoint_path {path} has no config.json (an EAGLE-3 head's directory is "
                              f"expected)")
    with open(raw_path) as f:
        raw = json.load(f)
    archs = raw.get("architectures") or []
    if not any("eagle3" in a.lower() for a in archs):
        raise CheckpointError(f"--sp_checkpoint_path {path}: architectures {archs} is not an EAGLE-3 head "
                              f"(LlamaForCausalLMEagle3); --sp_type=vanilla takes a whole draft model")
    model = read_hf_config(path, "llama")
    model.num_layers = 1
    eagle = raw.get("eagle_config") or {}
    aux = tuple(int(i) for i in (eagle.get("eagle_aux_hidden_state_layer_ids") or
                                 default_aux_layers(target.num_layers)))
    config = Eagle3Config(model=model, draft_vocab_size=int(raw.get("draft_vocab_size") or model.vocab_size),
                          aux_layers=aux, target_hidden_size=int(raw.get("target_hidden_size") or model.hidden_size))
    for field, mine, theirs in (("vocab_size", model.vocab_size, target.vocab_size),
                                ("target_hidden_size", config.target_hidden_size, target.hidden_size)):
        if mine != theirs:
            raise CheckpointError(f"--sp_checkpoint_path {path}: {field} {mine} does not match the target's "
                                  f"({theirs}): the head was trained for another model")
    if len(aux) != 3 or not all(0 <= i < target.num_layers for i in aux):
        raise CheckpointError(f"--sp_checkpoint_path {path}: eagle_aux_hidden_state_layer_ids {list(aux)} must be "
                              f"3 layers of the target's {target.num_layers}")
    return config


def read_eagle3_weights(path: str) -> Dict[str, torch.Tensor]:
    """Every tensor of the head (safetensors, or pytorch_model.bin as some heads are published)."""
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if files:
        weights = {}
        for f in files:
            weights.update(load_file(f))
        return weights
    bins = sorted(glob.glob(os.path.join(path, "*.bin")))
    if not bins:
        raise CheckpointError(f"--sp_checkpoint_path {path} has no *.safetensors or *.bin weights")
    weights = {}
    for f in bins:
        weights.update(torch.load(f, map_location="cpu", weights_only=True))
    return weights


class Eagle3Head:
    """The head on a DeviceBackend, in the target's run dtype; its KV cache is one layer of
    kv_cache_spec, indexed by the target's block tables and slots (eagle_drafter.py)."""

    def __init__(self, config: Eagle3Config, weights: Dict[str, torch.Tensor], backend: DeviceBackend,
                 dtype: torch.dtype, max_positions: int, embed: Callable[[torch.Tensor], torch.Tensor]):
        """embed: token ids [T] -> [T, H] rows of the target's table (used where the head has none)."""
        c = self.config = config.model
        self.aux_layers = config.aux_layers
        self.backend = be = backend
        dev = be.device
        missing = [n for n in ["fc.weight", "norm.weight", "lm_head.weight"] +
                   [f"midlayer.{m}.weight" for m in _MIDLAYER] if n not in weights]
        if missing:
            raise CheckpointError(f"EAGLE-3 head: missing tensor(s) {', '.join(missing)}")

        def w(name):
            return weights[name].to(dev, dtype)
        m = "midlayer."
        self.input_norm, self.hidden_norm = w(m + "input_layernorm.weight"), w(m + "hidden_norm.weight")
        self.post_norm, self.final_norm = w(m + "post_attention_layernorm.weight"), w("norm.weight")
        a = m + "self_attn."
        self.qkv = be.pack_linear(torch.cat([w(a + "q_proj.weight"), w(a + "k_proj.weight"), w(a + "v_proj.weight")]))
        self.o_proj = be.pack_linear(w(a + "o_proj.weight"))
        self.gate_up = be.pack_gate_up(torch.cat([w(m + "mlp.gate_proj.weight"), w(m + "mlp.up_proj.weight")]))
        self.down = be.pack_linear(w(m + "mlp.down_proj.weight"))
        self.fc = be.pack_linear(w("fc.weight"))
        self.lm_head = be.pack_lm_head(w("lm_head.weight"))
        dv = config.draft_vocab_size
        d2t = weights.get("d2t")
        # draft id -> target id (d2t holds offsets; a head without it shares the target's vocabulary)
        self.to_target = torch.arange(dv, dtype=torch.int64) + (d2t.to(torch.int64) if d2t is not None else 0)
        self.to_target = self.to_target.to(dev)
        own = weights.get("embed_tokens.weight", weights.get("model.embed_tokens.weight"))
        self.embed = embed if own is None else (lambda ids, table=own.to(dev, dtype): table[ids])
        cos, sin = cos_sin_table(c, max_positions)
        self.cos, self.sin = cos.to(dev), sin.to(dev)
        self.hidden_size = c.hidden_size
        self.num_heads, self.num_kv_heads = c.num_heads, c.num_kv_heads
        self.scale = c.head_dim ** -0.5
        self.kv_cache_spec = KVCacheSpec(1, c.num_kv_heads, c.head_dim)
        self.graph_capturable = True  # its draft steps (device/cuda/head_graphs.py)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_cache: torch.Tensor, hidden: torch.Tensor, rows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """token_ids, positions [T] (row i: t_{i+1} at position i); hidden [T, 3 Ht] (the target's aux
        rows) or [T, H] (the head's own); kv_cache [1, 2, ...]; rows [R]: the rows whose draft is
        wanted. Returns (drafts [R] int64, target ids; h [R, H], the rows' outputs before the norm)."""
        c, be = self.config, self.backend
        eps = c.rms_norm_eps
        g = hidden if hidden.shape[1] == self.hidden_size else be.linear(hidden, self.fc)
        T = token_ids.shape[0]
        x = torch.cat([be.rms_norm(self.embed(token_ids), self.input_norm, eps), be.rms_norm(g, self.hidden_norm, eps)],
                      dim=-1)
        q, k, v = be.qkv_to_cache(be.linear(x, self.qkv), self.num_heads, self.num_kv_heads, c.head_dim, None, None,
                                  eps, positions, self.cos, self.sin, kv_cache[0], meta)
        o = be.attention(q, k, v, kv_cache[0], meta, self.scale)
        h = g + be.linear(o.reshape(T, self.num_heads * c.head_dim), self.o_proj)
        h = h + be.linear(be.gate_up_silu(be.rms_norm(h, self.post_norm, eps), self.gate_up), self.down)
        h = h[rows]
        logits = be.lm_head(be.rms_norm(h, self.final_norm, eps), self.lm_head)
        return self.to_target[be.argmax(logits).long()], h
