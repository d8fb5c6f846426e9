"""DeepSeek-V3's multi-token-prediction layer as a drafting head (--sp_type=mtp; upstream's and
vLLM's `mtp`): the checkpoint's layer `model.layers.{L}` (L = num_hidden_layers; config.json's
num_nextn_predict_layers >= 1), a decoder layer of the model's own kind (MLA, MoE) trained to
predict the token after next from the model's final hidden state.

At position i it reads t_{i+1} and g_i, the target's residual stream after its last layer (before
the final norm; DecoderModel.aux at index L), or for a draft's next row the layer's own previous
output (shapes per row, H the hidden size):

    x = eh_proj([enorm(embed(t_{i+1})), hnorm(g)])   [2 H] -> [H]
    y = decoder_layer(x)                              (its own latent KV cache: one layer)
    draft = argmax(shared_head.head(shared_head.norm(y)))

and y (before the norm) feeds the next row. The layer runs as a one-layer DecoderModel whose
input is x instead of the embeddings (DecoderModel.forward's `embeds`). Its embedding table and
head are the target model's where the layer has no copy or its copy is the same (V3 ships copies of
both: ~1.9 GB each, read once and compared, never held twice; vLLM and SGLang share them too), else
the layer's own.
eagle_drafter.EagleDrafter drives it exactly as an EAGLE-3 head."""

import dataclasses
import json
import os
from typing import Dict, List, Optional, Tuple

import torch

from rtp_llm.config.model_config import ModelConfig
from rtp_llm.device.base import AttentionMetadata, DeviceBackend
from rtp_llm.model_loader.weights import CheckpointError
from rtp_llm.models_py.decoder import DecoderModel

# The layer's copies of the model's tables: the one-layer model's name -> the name within the layer.
_COPIES = {"model.embed_tokens.weight": "embed_tokens.weight", "lm_head.weight": "shared_head.head.weight"}
# the MTP layer's own modules (checkpoint prefix within the layer -> the one-layer model's name)
_OWN = {"enorm.": "mtp.enorm.", "hnorm.": "mtp.hnorm.", "eh_proj.": "mtp.eh_proj.", "shared_head.norm.": "model.norm.",
        "shared_head.head.": "lm_head.", "embed_tokens.": "model.embed_tokens."}


def mtp_layers(checkpoint_path: str, target: ModelConfig) -> int:
    """config.json's num_nextn_predict_layers, refused by name where there is no MTP layer to run."""
    path = os.path.join(checkpoint_path, "config.json")
    n = 0
    if os.path.exists(path):
        with open(path) as f:
            n = int(json.load(f).get("num_nextn_predict_layers") or 0)
    if target.mla is None or n < 1:
        raise CheckpointError(f"--sp_type=mtp: {checkpoint_path} has no multi-token-prediction layer "
                              f"(num_nextn_predict_layers {n}, model_type {target.model_type}); DeepSeek-V3 "
                              f"checkpoints (deepseek3) carry one")
    return n


def mtp_config(target: ModelConfig) -> ModelConfig:
    """The MTP layer as a one-layer model of the target's kind: its MLP is the MoE one."""
    moe = dataclasses.replace(target.moe, mlp_only_layers=()) if target.moe else None
    return dataclasses.replace(target, num_layers=1, moe=moe, tie_word_embeddings=False)


def mtp_names(names: List[str], layer: int) -> Dict[str, str]:
    """The one-layer model's tensor names -> the checkpoint's (layer `layer`'s, else the model's
    embedding and head)."""
    prefix = f"model.layers.{layer}."
    out = {"model.embed_tokens.weight": "model.embed_tokens.weight", "lm_head.weight": "lm_head.weight"}
    for name in names:
        if name.startswith(prefix):
            rest = name[len(prefix):]
            own = next((new + rest[len(old):] for old, new in _OWN.items() if rest.startswith(old)), None)
            out[own or "model.layers.0." + rest] = name
    return out


class MtpHead:
    """The MTP layer on a DeviceBackend (the EAGLE-3 head's interface: eagle3.Eagle3Head)."""

    def __init__(self, target: ModelConfig, checkpoint_path: str, backend: DeviceBackend, dtype: torch.dtype,
                 max_positions: int, progress: bool = False, model: Optional[DecoderModel] = None):
        """model: the target, loaded from the same checkpoint: its embedding table and head are used
        where the layer's are the same (module docstring)."""
        from rtp_llm.model_loader.hf_loader import load_hf_weights, same_or_absent

        layer = target.num_layers
        shared = []
        if model is not None:
            shared = same_or_absent(checkpoint_path, {n: f"model.layers.{layer}.{c}" for n, c in _COPIES.items()})
        c = mtp_config(target)
        H = c.hidden_size
        extra = {"mtp.enorm.weight": (H,), "mtp.hnorm.weight": (H,), "mtp.eh_proj.weight": (H, 2 * H)}
        weights = load_hf_weights(checkpoint_path, c, dtype, progress, select=lambda n: mtp_names(n, layer),
                                  extra=extra, omit=shared)
        self.backend = be = backend
        dev = be.device
        own = {name: weights.pop(name) for name in extra}
        self.enorm, self.hnorm = own["mtp.enorm.weight"].to(dev), own["mtp.hnorm.weight"].to(dev)
        eh = own["mtp.eh_proj.weight"]
        self.eh_proj = be.pack_linear((eh.dequantize() if hasattr(eh, "dequantize") else eh).to(dev, dtype))
        self.model = DecoderModel(c, weights, backend, max_positions, vocab_from=model)
        self.shared = tuple(shared)  # the target's tables used
        self.model.aux_layers = (1,)  # its output before the norm: the next row's hidden state
        self.eps = c.rms_norm_eps
        self.aux_layers: Tuple[int, ...] = (layer,)  # the target's residual stream after its last layer
        self.hidden_size = H
        self.kv_cache_spec = self.model.kv_cache_spec
        self.graph_capturable = self.model.graph_capturable

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_cache: torch.Tensor, hidden: torch.Tensor, rows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """As Eagle3Head.forward: hidden [T, H] (the target's or this layer's); returns (drafts [R]
        int64, h [R, H] the rows' outputs before the norm)."""
        be, m = self.backend, self.model
        x = torch.cat([be.rms_norm(m.embed_rows(token_ids), self.enorm, self.eps),
                       be.rms_norm(hidden, self.hnorm, self.eps)], dim=-1)
        logits = m.forward(token_ids, positions, meta, kv_cache, rows, embeds=be.linear(x, self.eh_proj))
        return be.argmax(logits).long(), m.aux[rows]
