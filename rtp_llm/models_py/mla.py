"""DeepSeek-V2/V3 multi-head latent attention: the layer's weights (this rank's heads) and its
forward up to the output projection, over the latent KV cache through the device backend
(DeviceBackend.write_latent / mla_attention).

Per token: [q_a or q | kv_a] = x [q_a_proj or q_proj ; kv_a_proj_with_mqa]^T (one GEMM);
q = q_b_proj(rms_norm(q_a)) with q LoRA; the cache entry is [rms_norm(kv_a[:kvr]), rope(kv_a[kvr:])],
W = kvr + dr wide; the query heads' rope halves are rotated likewise. Shapes: T tokens, H this
rank's heads, dn / dr / dv the no-rope, rope and value head dims, kvr kv_lora_rank, qr
q_lora_rank. Tensor parallelism: q_b_proj (or q_proj) and kv_b_proj by heads, o_proj's columns
by heads (row-parallel, the decoder all-reduces); q_a / kv_a projections, their norms and the
latent cache are replicated, so every rank caches the same latents."""

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from rtp_llm.config.model_config import ModelConfig
from rtp_llm.device.base import AttentionMetadata, DeviceBackend

# transformers builds q_a_layernorm and kv_a_layernorm with RMSNorm's default eps, not rms_norm_eps.
LORA_NORM_EPS = 1e-6


def _rope_rows_deinterleaved(dr: int) -> torch.Tensor:
    """The row order that turns interleaved rope pairs (x0, x1), (x2, x3) ... into rotate_half's
    halves (x0, x2, ... | x1, x3, ...). q and k_pe permuted alike leave every score unchanged:
    transformers' interleaved rotation is this permutation, then rotate_half."""
    return torch.cat([torch.arange(0, dr, 2), torch.arange(1, dr, 2)])


@dataclass
class MlaLayer:
    proj_in: torch.Tensor            # [qr or H (dn + dr) | kvr + dr, hidden], backend.pack_linear layout
    q_a_norm: Optional[torch.Tensor]  # [qr] (None: no q LoRA)
    q_b: Optional[torch.Tensor]       # [H (dn + dr), qr], backend.pack_linear layout
    kv_a_norm: torch.Tensor          # [kvr]
    kv_b: torch.Tensor               # [kvr, H (dn + dv)]: kv_b_proj transposed (expanding K/V)
    w_uk: torch.Tensor               # [H, dn, kvr]: its key half per head (absorbed into q)
    w_uv: torch.Tensor               # [H, kvr, dv]: its value half per head, transposed (absorbed into o)


def load_mla(c: ModelConfig, a: str, w: Callable[..., torch.Tensor], be: DeviceBackend, h0: int, H: int) -> MlaLayer:
    """Attention prefix a's weights for heads [h0, h0 + H); w(name, rows=, cols=) is the
    decoder's slicer (a checkpoint tensor onto the device)."""
    m = c.mla
    dn, dr, dv, kvr, qk = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank, m.qk_head_dim
    perm = _rope_rows_deinterleaved(dr) if m.rope_interleave else None

    def rope_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
        """Each head's last dr rows of t [heads (dn + dr) or dr-tailed, in] de-interleaved."""
        if perm is None:
            return t
        t = t.reshape(heads, -1, t.shape[-1])
        return torch.cat([t[:, :-dr], t[:, -dr:][:, perm.to(t.device)]], dim=1).reshape(-1, t.shape[-1])

    kv_a = rope_rows(w(a + "kv_a_proj_with_mqa.weight"), 1)              # [kvr + dr, hidden]
    q_rows = (h0 * qk, H * qk)
    if m.q_lora_rank is None:
        q_in, q_a_norm, q_b = rope_rows(w(a + "q_proj.weight", q_rows), H), None, None
    else:
        q_in, q_a_norm = w(a + "q_a_proj.weight"), w(a + "q_a_layernorm.weight")
        q_b = be.pack_linear(rope_rows(w(a + "q_b_proj.weight", q_rows), H))
    kv_b = w(a + "kv_b_proj.weight", (h0 * (dn + dv), H * (dn + dv)))     # [H (dn + dv), kvr]
    per_head = kv_b.view(H, dn + dv, kvr)
    return MlaLayer(proj_in=be.pack_linear(torch.cat([q_in, kv_a])), q_a_norm=q_a_norm, q_b=q_b,
                    kv_a_norm=w(a + "kv_a_layernorm.weight"), kv_b=kv_b.t().contiguous(),
                    w_uk=per_head[:, :dn].contiguous(), w_uv=per_head[:, dn:].transpose(1, 2).contiguous())


class MlaAttention:
    """The model-wide constants of the latent attention; forward() runs one layer."""

    def __init__(self, c: ModelConfig, num_heads: int):
        m = c.mla
        self.H, self.dn, self.dr, self.dv, self.kvr = (num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim,
                                                       m.v_head_dim, m.kv_lora_rank)
        self.q_in = m.q_lora_rank if m.q_lora_rank is not None else num_heads * m.qk_head_dim
        self.scale = m.softmax_scale(c.rope_scaling)  # yarn's mscale_all_dim correction included

    def forward(self, layer: MlaLayer, x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, cache: torch.Tensor, meta: AttentionMetadata, be: DeviceBackend) -> torch.Tensor:
        """x [T, hidden] (input-normed) -> [T, H dv], the input of o_proj; writes this step's
        latents into cache [blocks, block_size, kvr + dr] first."""
        T, H = x.shape[0], self.H
        a = be.linear(x, layer.proj_in)                                     # [T, q_in + kvr + dr]
        if layer.q_b is None:
            q = a[:, :self.q_in]
        else:
            q = be.linear(be.rms_norm(a[:, :self.q_in].contiguous(), layer.q_a_norm, LORA_NORM_EPS), layer.q_b)
        q = q.reshape(T, H, self.dn + self.dr)
        latent = be.rms_norm(a[:, self.q_in:self.q_in + self.kvr].contiguous(), layer.kv_a_norm, LORA_NORM_EPS)
        q_pe, k_pe = be.rotary(q[..., self.dn:].contiguous(), a[:, self.q_in + self.kvr:].reshape(T, 1, self.dr),
                               positions, cos, sin)
        entry = torch.cat([latent, k_pe.reshape(T, self.dr)], dim=1)       # [T, kvr + dr]: the cache row
        be.write_latent(entry, cache, meta)
        o = be.mla_attention(q[..., :self.dn], q_pe, entry, cache, meta, layer.w_uk, layer.w_uv, layer.kv_b,
                             self.scale)                                    # [T, H, dv]
        return o.reshape(T, H * self.dv)
