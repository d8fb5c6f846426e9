"""CPU backend: the compute-ops extension's kernels: paged attention (prefill, chunks after a
cached prefix and decode in one call, reading K/V through the block tables), q/k norm +
rotary + KV store in one pass, fused residual-add + RMSNorm and SiLU-and-mul."""

import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from rtp_llm.device.base import AttentionMetadata, DeviceBackend
from rtp_llm.device.cpu import mla
from rtp_llm.device.cpu.kquant import OPS_STEMS, KQuantLinear
from rtp_llm.device.cpu.q8_0 import Q8_0Linear
from rtp_llm.model_loader.quantized import KEPT_FORMATS, Q4_KTensor, Q5_KTensor, Q6_KTensor, QuantizedTensor

_QUANTIZED_LINEARS = (Q8_0Linear, KQuantLinear)


@dataclass
class CpuAttentionMetadata(AttentionMetadata):
    slot_mapping: torch.Tensor  # [T] int64
    # Streams for the paged kernel (decode, and short prompt chunks where its AVX-512 kernel
    # runs): their token rows (None when it takes every stream, i.e. all rows), block tables
    # [Sp, B], query starts [Sp + 1] and context lengths [Sp], int32.
    paged_rows: Optional[torch.Tensor]
    block_tables: torch.Tensor
    query_starts: torch.Tensor
    context_lens: torch.Tensor
    # The other prompt chunks: (first row, rows, KV slots of the cached prefix or None). Long
    # ones are compute-bound, so they go to SDPA (GEMMs).
    chunks: List[Tuple[int, int, Optional[torch.Tensor]]] = field(default_factory=list)
    # MLA: the decode rows' gather plan (mla.decode_plan), made by the step's first layer.
    mla_plan: Optional[list] = None


def _mkldnn_packing_works() -> bool:
    """oneDNN's prepacked bf16 linear (torch.ops.mkldnn), where this torch build has it."""
    try:
        w = torch.ones(32, 16, dtype=torch.bfloat16)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 16, dtype=torch.bfloat16),
                                                 torch.ops.mkldnn._reorder_linear_weight(w, 16), None, "none", [], "")
        return bool((out == 16).all())
    except (RuntimeError, AttributeError):
        return False


class CpuBackend(DeviceBackend):
    name = "cpu"
    device = torch.device("cpu")
    block_sizes = (16, 32, 64)
    supports_mla = True  # device/cpu/mla.py (torch ops)
    # Prompt chunks of at most this many (query token, key) pairs run on the paged kernel, the
    # others on SDPA; 0: every one on SDPA. Set by bind_model.
    paged_chunk_work = 0

    def __init__(self):
        from rtp_llm.ops import ensure_compute_ops_loaded

        self._ops = ensure_compute_ops_loaded()
        self._bf16_gemm = self._ops.bf16_linear_supported()
        self._packed_bf16 = _mkldnn_packing_works()
        self._kv_format = (torch.float32, 0)  # (dtype, block_size) of the KV cache, once allocated
        self._mla = False  # the cache is MLA's latent one (allocate_latent_cache)

    def allocate_kv_cache(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                          dtype: torch.dtype) -> torch.Tensor:
        self._kv_format = (dtype, block_size)  # for bind_model, which comes next
        return super().allocate_kv_cache(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype)

    def allocate_latent_cache(self, num_layers, num_blocks, block_size, latent_dim, dtype):
        self._mla = True  # for bind_model: MLA's prompt chunks stay off the paged path
        return super().allocate_latent_cache(num_layers, num_blocks, block_size, latent_dim, dtype)

    def write_latent(self, entry, cache, meta):
        mla.write_latent(entry, cache, meta.slot_mapping)

    def mla_attention(self, q_nope, q_pe, entry, cache, meta, w_uk, w_uv, kv_b, scale):
        return mla.mla_attention(q_nope, q_pe, entry, cache, meta, w_uk, w_uv, kv_b, scale)

    def bind_model(self, num_heads: int, num_kv_heads: int, head_dim: int, max_batch_size: int, max_seq_len: int):
        if self._mla:  # decode rows only on the paged (absorbed) path, every prompt chunk expanded
            self.paged_chunk_work = 0
            return
        # Prompt chunks go to the paged kernel where it beats SDPA (docs/benchmarks.md): bf16
        # through its vectorized kernel with scores by `vdpbf16ps` (CPUs with AVX512-BF16), up
        # to 512 x 512 query-key pairs; SDPA's GEMMs win on longer prompts.
        dtype, block_size = self._kv_format
        fast = (self._bf16_gemm and dtype == torch.bfloat16
                and self._ops.paged_attention_vectorized(head_dim, num_heads // num_kv_heads, block_size))
        self.paged_chunk_work = 512 * 512 if fast else 0

    def available_memory_bytes(self) -> int:
        try:
            pages = os.sysconf("SC_AVPHYS_PAGES")
            return int(pages * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            return 4 << 30

    def prepare_attention(self, batch, block_size: int) -> CpuAttentionMetadata:
        q_lens = batch.query_lens
        paged = (q_lens == 1) | (q_lens.astype(np.int64) * batch.context_lens <= self.paged_chunk_work)
        if paged.all():  # zero-copy views of the core's step batch (valid for this step)
            meta = CpuAttentionMetadata(torch.from_numpy(batch.slot_mapping), None,
                                        torch.from_numpy(batch.block_tables), torch.from_numpy(batch.query_starts),
                                        torch.from_numpy(batch.context_lens))
            return meta
        idx = np.nonzero(paged)[0]
        lens = q_lens[idx].astype(np.int64)
        starts = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lens, out=starts[1:])
        # Row r of the paged streams' tokens: its stream's first row in the batch plus its offset.
        rows = np.repeat(batch.query_starts[idx].astype(np.int64) - starts[:-1], lens) + np.arange(starts[-1])
        meta = CpuAttentionMetadata(
            torch.from_numpy(batch.slot_mapping),
            torch.from_numpy(rows),
            torch.from_numpy(np.ascontiguousarray(batch.block_tables[idx])),
            torch.from_numpy(starts.astype(np.int32)),
            torch.from_numpy(np.ascontiguousarray(batch.context_lens[idx])),
        )
        for i in np.nonzero(~paged)[0]:
            start, n, prefix = int(batch.query_starts[i]), int(q_lens[i]), int(batch.prefix_lens[i])
            slots = None
            if prefix:
                pos = np.arange(prefix + n)
                slots = torch.from_numpy(batch.block_tables[i][pos // block_size].astype(np.int64) * block_size
                                         + pos % block_size)
            meta.chunks.append((start, n, slots))
        return meta

    def qkv_to_cache(self, qkv, num_heads, num_kv_heads, head_dim, q_norm, k_norm, eps, positions, cos, sin, kv,
                     meta):
        # One pass per token (norm, rotary, KV store) in the compute ops: 4-5 ops' dispatch
        # and Python slicing cost more than the work at decode batches.
        return self._ops.qkv_rope_store(qkv, num_heads, num_kv_heads, positions, cos, sin, kv, meta.slot_mapping,
                                        q_norm, k_norm, eps)

    def write_kv(self, k, v, kv, meta):
        self._ops.store_kv(k, v, kv, meta.slot_mapping)

    def attention(self, q, k, v, kv, meta, scale):
        if meta.paged_rows is None:
            return self._ops.paged_attention(q, kv[0], kv[1], meta.block_tables, meta.query_starts,
                                             meta.context_lens, scale)
        out = torch.empty_like(q)
        if len(meta.paged_rows):
            out[meta.paged_rows] = self._ops.paged_attention(q[meta.paged_rows], kv[0], kv[1], meta.block_tables,
                                                             meta.query_starts, meta.context_lens, scale)
        for start, n, slots in meta.chunks:
            qs = q[start:start + n].transpose(0, 1)  # [H, n, D]
            if slots is None:  # a whole prompt: its K/V are this step's
                ks, vs = k[start:start + n].transpose(0, 1), v[start:start + n].transpose(0, 1)
                mask = None
            else:  # a chunk after a cached prefix: K/V of the whole context from the cache
                ks = kv[0].view(-1, *kv.shape[-2:])[slots].transpose(0, 1)
                vs = kv[1].view(-1, *kv.shape[-2:])[slots].transpose(0, 1)
                c = slots.shape[0]
                mask = torch.arange(c)[None, :] <= torch.arange(c - n, c)[:, None]
            o = F.scaled_dot_product_attention(qs[None], ks[None], vs[None], attn_mask=mask, is_causal=mask is None,
                                               scale=scale, enable_gqa=True)
            out[start:start + n] = o[0].transpose(0, 1)
        return out

    # bf16 projections, weights packed once at load: on CPUs with AVX512-BF16 into the compute
    # ops' GEMM layout (ops.bf16_linear, faster than oneDNN at decode rows and about even at
    # prefill chunks, so one copy of the weights serves both), elsewhere into oneDNN's blocked
    # layout (what torch's own CPU compiler does; faster than x @ w at decode rows). Readings:
    # docs/benchmarks.md. fp32 (the parity reference) keeps x @ w over [in, out].
    def _bf16_gemm_packs(self, weight) -> bool:
        return (weight.dtype == torch.bfloat16 and self._bf16_gemm and weight.shape[0] % 16 == 0
                and weight.shape[1] % 2 == 0)

    # GGUF projections in the formats the compute ops have kernels for stay quantized
    # (Q8_0Linear for the 32-block formats Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1, KQuantLinear for Q4_K,
    # Q5_K and Q6_K): q8_0_linear / q4_k_linear / q5_k_linear / q6_k_linear, on AVX-512 VNNI where the CPU has it,
    # portable C++ elsewhere; any row count (decode and prefill alike), activations quantized on
    # the fly (per 32-block, per 256 for the k-quants).
    def keeps_quantized(self, weight):
        return isinstance(weight, QuantizedTensor) and KEPT_FORMATS.get(weight.QTYPE) is type(weight)

    def _pack_quantized(self, weight):
        if isinstance(weight, (Q4_KTensor, Q5_KTensor, Q6_KTensor)):
            stem = OPS_STEMS[type(weight).__name__]
            return KQuantLinear(getattr(self._ops, f"pack_{stem}_linear")(weight.blocks), *weight.shape, stem)
        pack = getattr(self._ops, f"pack_{weight.QTYPE.lower()}_linear")
        return Q8_0Linear(pack(weight.blocks), *weight.shape, weight.QTYPE)

    def pack_linear(self, weight):
        if self.keeps_quantized(weight):
            return self._pack_quantized(weight)
        if self._bf16_gemm_packs(weight):
            return self._ops.pack_bf16_linear(weight)
        if weight.dtype == torch.bfloat16 and self._packed_bf16:
            return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 16)
        return weight.t().contiguous()

    # SiLU-and-mul in the bf16 GEMM's epilogue (gate and up blocks interleaved by the packing,
    # a 5-D layout of its own): one pass instead of writing [T, 2 I] and reading it back.
    # Other layouts take linear + silu_and_mul.
    def pack_gate_up(self, weight):
        if self.keeps_quantized(weight):
            return self._pack_quantized(weight)  # gate_up_silu: the quantized linear, then silu_and_mul
        if self._bf16_gemm_packs(weight) and weight.shape[0] % 32 == 0:
            return self._ops.pack_bf16_gate_up(weight)
        return self.pack_linear(weight)

    def gate_up_silu(self, x, gate_up):
        if isinstance(gate_up, _QUANTIZED_LINEARS):
            return self.silu_and_mul(self.linear(x, gate_up))
        if gate_up.dim() == 5:
            return self._ops.bf16_linear_silu(x, gate_up)
        return self.silu_and_mul(self.linear(x, gate_up))

    def linear(self, x, weight, out=None):
        if isinstance(weight, Q8_0Linear):
            return self._ops.q8_0_linear(x, weight.packed, weight.out_features, weight.qtype, out)
        if isinstance(weight, KQuantLinear):
            return getattr(self._ops, f"{weight.stem}_linear")(x, weight.packed, weight.out_features, out)
        if weight.dim() == 4:  # pack_bf16_linear's layout
            return self._ops.bf16_linear(x, weight, out)
        if weight.dtype == torch.bfloat16 and self._packed_bf16:
            y = torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
            return y if out is None else out.copy_(y)
        return torch.matmul(x, weight, out=out)

    def pack_lm_head(self, weight):
        # A packed copy even for tied embeddings (the lookup needs the plain table): the LM
        # head is the largest GEMV of a decode step (Qwen2.5-0.5B: 272 MB of ~1 GB). A head in a
        # kept format stays quantized, tied ones included (the loader keeps a GGUF embedding
        # table in its blocks: the lookup widens the rows it reads, the head packs the table).
        if self.keeps_quantized(weight):
            return self._pack_quantized(weight)
        if weight.dtype == torch.bfloat16 and (self._bf16_gemm_packs(weight) or self._packed_bf16):
            return self.pack_linear(weight)
        return weight

    def lm_head(self, h, weight):
        if isinstance(weight, _QUANTIZED_LINEARS):
            return self.linear(h, weight)
        if weight.dim() == 4 or (weight.dtype == torch.bfloat16 and self._packed_bf16):
            return self.linear(h, weight)
        return torch.nn.functional.linear(h, weight)

    def argmax(self, logits):
        return self._ops.argmax_rows(logits)

    def apply_token_bitmask(self, logits, rows, bits):
        # In place on the rows, only the banned entries written (xgrammar's CPU kernel, on the
        # rows gathered and scattered back, took ~10x as long: docs/benchmarks.md).
        if logits.dtype != torch.float32 or logits.stride(1) != 1:
            return super().apply_token_bitmask(logits, rows, bits)
        self._ops.apply_token_bitmask(logits, rows, bits)

    def rms_norm(self, x, weight, eps):
        return self._ops.rms_norm(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):
        return self._ops.fused_add_rms_norm(x, residual, weight, eps)

    def rotary(self, q, k, positions, cos, sin):
        self._ops.rotary_embedding(q, k, positions, cos, sin)
        return q, k

    def silu_and_mul(self, x):
        return self._ops.silu_and_mul(x)
