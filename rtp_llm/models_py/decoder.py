"""One decoder-only transformer covering Qwen3 (q/k norm), Qwen2 (q/k/v bias) and Llama
(SmolLM2), their mixture-of-experts kin Qwen3-MoE and Qwen2-MoE (the MLP of the sparse
layers is models_py/moe.py's MoeMLP), and DeepSeek-V2/V3 (multi-head latent attention,
models_py/mla.py, and MoeMLP with grouped routing): GQA/MQA, tied or untied embeddings, rotary
with theta and scaling. It runs on the paged KV cache through a DeviceBackend; shapes: T tokens in the
step, H heads, Hkv KV heads, D head_dim, all of them this rank's shard under tensor
parallelism (TPShard)."""

import collections
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from rtp_llm.config.model_config import ModelConfig
from rtp_llm.device.base import AttentionMetadata, DeviceBackend, KVCacheSpec
from rtp_llm.distributed.tensor_parallel import TPShard
from rtp_llm.model_loader.quantized import QuantizedTensor, cat_rows, take
from rtp_llm.models_py.mla import MlaAttention, MlaLayer, load_mla
from rtp_llm.models_py.moe import MoeMLP, load_moe_mlp
from rtp_llm.models_py.rotary import cos_sin_table

log = logging.getLogger(__name__)


@dataclass
class Layer:
    # Projection weights in the backend's layout (DeviceBackend.pack_linear, gate_up by
    # pack_gate_up), applied with backend.linear (gate_up by gate_up_silu); shapes below are
    # HF's [out, in].
    input_norm: torch.Tensor
    qkv: Optional[torch.Tensor]  # [(H + 2 Hkv) D, hidden]: q, k and v projections fused (None: mla)
    qkv_bias: Optional[torch.Tensor]
    q_norm: Optional[torch.Tensor]
    k_norm: Optional[torch.Tensor]
    o_proj: torch.Tensor         # [hidden, H D] (mla: [hidden, H v_head_dim])
    post_norm: torch.Tensor
    # The MLP: dense (gate_up [2 I, hidden], down [hidden, I]) or, in a sparse layer, moe.
    gate_up: Optional[torch.Tensor]
    down: Optional[torch.Tensor]
    moe: Optional[MoeMLP] = None
    mla: Optional[MlaLayer] = None  # DeepSeek's latent attention instead of qkv


class DecoderModel:
    def __init__(self, config: ModelConfig, weights: Dict[str, torch.Tensor], backend: DeviceBackend,
                 max_positions: int, tp: Optional[TPShard] = None, vocab_from: Optional["DecoderModel"] = None):
        """vocab_from: a model whose embedding table and LM head this one uses where `weights` has
        none of its own (an MTP layer's: models_py/mtp.py; the same rank and layout)."""
        self.config = c = config
        self.backend = backend
        if c.mla is not None:
            backend.check_mla()  # first: a device without MLA kernels refuses by name, before any packing
        self.tp = tp = tp or TPShard()
        dev = backend.device
        pack = backend.pack_linear
        D = c.head_dim
        q0, self.num_heads, k0, self.num_kv_heads = tp.heads(c.num_heads, c.num_kv_heads)
        self.vocab_start, vocab_rows = tp.vocab(c.vocab_size)

        widened = collections.Counter()  # quantized format -> tensors widened (this device has no kernels)

        def w(name, rows=None, cols=None):
            """This rank's slice of a checkpoint tensor, on the device; a quantized one (GGUF
            projections and embedding tables, FP8 projections) stays quantized, for pack_linear and
            the lookup, where the backend computes on it, and is widened to the run dtype elsewhere."""
            t = take(weights[name], rows, cols)
            if isinstance(t, QuantizedTensor):
                if backend.keeps_quantized(t):
                    return t
                widened[t.QTYPE] += 1
                return t.dequantize().to(dev)
            return t.to(dev)

        def vocab_slice(name):
            t = w(name, rows=(self.vocab_start, vocab_rows))
            if t.shape[0] < vocab_rows:  # the last rank's slice of a vocab not divisible by tp
                pad = vocab_rows - t.shape[0]
                t = t.pad_rows(pad) if isinstance(t, QuantizedTensor) else torch.cat([t, t.new_zeros(pad, t.shape[1])])
            return t

        q_rows, kv_rows = (q0 * D, self.num_heads * D), (k0 * D, self.num_kv_heads * D)
        self.embed, self.lm_head = self._vocab_tables(vocab_slice, weights, vocab_from)
        self.final_norm = w("model.norm.weight")
        self.mla = None
        if c.mla is not None:
            self.mla = MlaAttention(c, self.num_heads)
        self.layers: List[Layer] = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            if self.mla is not None:
                dv = c.mla.v_head_dim
                attn = dict(qkv=None, qkv_bias=None, q_norm=None, k_norm=None,
                            mla=load_mla(c, a, w, backend, q0, self.num_heads),
                            o_proj=pack(w(a + "o_proj.weight", cols=(q0 * dv, self.num_heads * dv))))
            else:
                attn = self._qkv_attention(a, w, q_rows, kv_rows)
            self.layers.append(Layer(
                input_norm=w(p + "input_layernorm.weight"),
                post_norm=w(p + "post_attention_layernorm.weight"),
                **attn,
                **(dict(gate_up=None, down=None, moe=load_moe_mlp(c.moe, p, w, weights, backend, tp))
                   if c.is_sparse(i) else self._dense_mlp(p, w)),
            ))
        if widened:
            log.info("Quantized tensors widened to the run dtype at load (%s has no kernels for them): %s", dev.type,
                     ", ".join(f"{n} {q}" for q, n in sorted(widened.items())))
        # The reference MoE path sizes its per-expert slices on the host (DeviceBackend.moe), as
        # the CPU's MLA plans its gathers: unless the backend's do not, such steps run eagerly,
        # not from captured graphs.
        self.graph_capturable = all((layer.mla is None or backend.mla_capturable) and
                                    (layer.moe is None or backend.moe_capturable) for layer in self.layers)
        cos, sin = cos_sin_table(c, max_positions)
        self.cos, self.sin = cos.to(dev), sin.to(dev)
        self.q_size = self.num_heads * (c.mla.v_head_dim if c.mla else D)  # attention output width
        self.kv_size = self.num_kv_heads * D
        self.scale = D ** -0.5
        # The cache a token fills per layer on this rank: K/V of this rank's KV heads, or MLA's
        # latent and rope key (replicated across ranks).
        self.kv_cache_spec = (KVCacheSpec(c.num_layers, latent_dim=c.mla.latent_dim) if c.mla else
                              KVCacheSpec(c.num_layers, self.num_kv_heads, D))
        # A drafting head's inputs (models_py/eagle3.py, mtp.py): the residual stream entering each of
        # these layers (num_layers: leaving the last, before the final norm), kept by every forward in
        # `aux` [T, len(aux_layers) hidden] (none by default).
        self.aux_layers: tuple = ()
        self.aux: Optional[torch.Tensor] = None

    def _vocab_tables(self, vocab_slice, weights, vocab_from: Optional["DecoderModel"]) -> tuple:
        """(the embedding table, the packed LM head): this rank's slices of `weights`' or, where
        weights has none, vocab_from's, as loaded there."""
        c = self.config

        def mine(name):
            return vocab_from is None or name in weights

        embed = vocab_slice("model.embed_tokens.weight") if mine("model.embed_tokens.weight") else vocab_from.embed
        if c.tie_word_embeddings:
            return embed, self.backend.pack_lm_head(embed)
        if mine("lm_head.weight"):
            return embed, self.backend.pack_lm_head(vocab_slice("lm_head.weight"))
        return embed, vocab_from.lm_head

    def _qkv_attention(self, a: str, w, q_rows, kv_rows) -> dict:
        """Attention prefix a's fused q/k/v projection (and bias, q/k norms) and o_proj, this
        rank's heads."""
        c, pack = self.config, self.backend.pack_linear
        bias = None
        if c.qkv_bias:
            bias = torch.cat([w(a + "q_proj.bias", q_rows), w(a + "k_proj.bias", kv_rows),
                              w(a + "v_proj.bias", kv_rows)])
        return dict(qkv=pack(cat_rows([w(a + "q_proj.weight", q_rows), w(a + "k_proj.weight", kv_rows),
                                       w(a + "v_proj.weight", kv_rows)])),
                    qkv_bias=bias,
                    q_norm=w(a + "q_norm.weight") if c.qk_norm else None,
                    k_norm=w(a + "k_norm.weight") if c.qk_norm else None,
                    o_proj=pack(w(a + "o_proj.weight", cols=q_rows)))

    def _dense_mlp(self, p: str, w) -> dict:
        """Layer prefix p's dense MLP, this rank's slice of the intermediate dimension."""
        i0, ni = self.tp.split(self.config.intermediate_size, "intermediate_size")
        return dict(gate_up=self.backend.pack_gate_up(cat_rows([w(p + "mlp.gate_proj.weight", (i0, ni)),
                                                                w(p + "mlp.up_proj.weight", (i0, ni))])),
                    down=self.backend.pack_linear(w(p + "mlp.down_proj.weight", cols=(i0, ni))))

    def _rows(self, ids: torch.Tensor) -> torch.Tensor:
        # A quantized table (a GGUF one the backend keeps) widens only the rows it reads.
        return self.embed.lookup(ids) if isinstance(self.embed, QuantizedTensor) else self.embed[ids]

    def embed_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[T, hidden] rows of the token embedding (one rank's whole table: an EAGLE-3 head's input)."""
        return self._rows(token_ids)

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self._rows(token_ids)
        # Vocab-parallel: each rank looks up the ids in its slice, zeros elsewhere; the sum of
        # one row and zeros is exact.
        local = token_ids - self.vocab_start
        mine = (local >= 0) & (local < self.embed.shape[0])
        rows = self._rows(torch.where(mine, local, torch.zeros_like(local)))
        return self.tp.all_reduce(rows * mine[:, None].to(rows.dtype))

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_cache: torch.Tensor, sample_rows: Optional[torch.Tensor],
                logits_out: Optional[torch.Tensor] = None, aux_out: Optional[torch.Tensor] = None,
                embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        """token_ids, positions: [T]; kv_cache: [L, 2, ...] (MLA: [L, blocks, block_size, latent]);
        sample_rows: [N] rows whose next token is wanted (None: all T). Returns logits [N, vocab]
        in fp32: logits_out[:N] when given ([>= N, vocab] fp32; captured graphs share one such
        buffer rather than each keeping its own output alive). aux_out: likewise, [>= T, len(aux_layers)
        hidden] for `aux`. embeds: [T, hidden], the layers' input instead of the token embeddings (an
        MTP layer's, models_py/mtp.py; updated in place)."""
        c, be, tp = self.config, self.backend, self.tp
        T = token_ids.shape[0]
        # [T, hidden]; every layer adds into it in place
        residual = self._embed(token_ids) if embeds is None else embeds
        # Where the row-parallel projections write their partial sums: the all-reduce's own
        # buffer under TP on GPUs (no copy-in), else None (anywhere).
        send = tp.send_buffer(T, residual.shape[1], residual.dtype)
        x = be.rms_norm(residual, self.layers[0].input_norm, c.rms_norm_eps)
        aux = None
        if self.aux_layers:
            width = len(self.aux_layers) * residual.shape[1]
            aux = aux_out[:T] if aux_out is not None else residual.new_empty(T, width)
        for i, layer in enumerate(self.layers):
            for j in (j for j, a in enumerate(self.aux_layers) if a == i):
                aux[:, j * residual.shape[1]:(j + 1) * residual.shape[1]].copy_(residual)
            if layer.mla is not None:
                o = self.mla.forward(layer.mla, x, positions, self.cos, self.sin, kv_cache[i], meta, be)
            else:
                qkv = be.linear(x, layer.qkv)
                if layer.qkv_bias is not None:
                    qkv += layer.qkv_bias
                q, k, v = be.qkv_to_cache(qkv, self.num_heads, self.num_kv_heads, c.head_dim, layer.q_norm,
                                          layer.k_norm, c.rms_norm_eps, positions, self.cos, self.sin, kv_cache[i],
                                          meta)
                o = be.attention(q, k, v, kv_cache[i], meta, self.scale)
            attn = be.linear(o.reshape(T, self.q_size), layer.o_proj, out=send)  # row-parallel
            x = tp.all_reduce_add_rms_norm(attn, residual, layer.post_norm, c.rms_norm_eps, be)
            if layer.moe is not None:
                mlp = layer.moe.forward(x, be)  # row-parallel too: partial sums
            else:
                mlp = be.linear(be.gate_up_silu(x, layer.gate_up), layer.down, out=send)
            next_norm = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.final_norm
            x = tp.all_reduce_add_rms_norm(mlp, residual, next_norm, c.rms_norm_eps, be)
        for j in (j for j, a in enumerate(self.aux_layers) if a == len(self.layers)):
            aux[:, j * residual.shape[1]:(j + 1) * residual.shape[1]].copy_(residual)
        self.aux = aux
        if sample_rows is not None and sample_rows.shape[0] == 0:  # the KV cache only (a draft's mirror)
            return x.new_empty(0, c.vocab_size, dtype=torch.float32)
        h = x if sample_rows is None else x[sample_rows]
        logits = tp.gather_vocab(be.lm_head(h, self.lm_head), c.vocab_size)
        if logits_out is None:
            return logits.float()
        out = logits_out[:logits.shape[0]]
        out.copy_(logits)  # the fp32 conversion, into the shared buffer
        return out
