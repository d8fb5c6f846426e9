"""Ascend NPU backend (torch_npu 2.9.0.post2 on CANN 8.5): ATB paged attention for decode,
fused infer attention score over the paged cache for prefill, prompt chunks and mixed
batches, ATB reshape-and-cache for the KV write, npu_rms_norm / npu_add_rms_norm,
npu_rotary_mul and npu_swiglu. KV blocks are 128 tokens (ATB's paged attention wants a
multiple of 16, at most 128).

torch_npu is imported lazily, here only: importing it where CANN is missing breaks `import
torch`. The ops are called through torch.ops.npu / torch.ops.atb, the namespaces torch_npu
registers them in, so //rtp_llm:npu_schema_test can register the very same schemas (read
from the torch_npu wheel) on CPU torch with reference kernels and run this backend for real.

Not done: NPUGraph capture of decode steps."""

from dataclasses import dataclass
from typing import List, Optional

import torch

from rtp_llm.device.base import AttentionMetadata, DeviceBackend, accelerator_kv_cache_bytes

# sparse_mode=3 ("right-down causal") aligns each query run with the end of its context and
# takes this fixed 2048 x 2048 mask (True: masked), as fused infer attention score requires.
_CAUSAL_MASK_SIZE = 2048


@dataclass
class NpuAttentionMetadata(AttentionMetadata):
    slot_mapping: torch.Tensor     # [T] int32, device
    block_tables: torch.Tensor     # [S, max_blocks] int32, device
    context_lens: torch.Tensor     # [S] int32, host (ATB reads it on the host)
    decode: bool                   # every stream has one query token: ATB paged attention
    query_ends: List[int]          # cumulative query lengths (TND layout's actual_seq_lengths)
    kv_lens: List[int]             # context length per stream (actual_seq_lengths_kv)


def _import_torch_npu():
    try:
        import torch_npu  # noqa: F401  (registers torch.ops.npu / torch.ops.atb and torch.npu)
    except ImportError as e:
        raise RuntimeError("--device=npu needs torch_npu==2.9.0.post2 and CANN 8.5 (pip install "
                           "torch_npu==2.9.0.post2; source /usr/local/Ascend/ascend-toolkit/set_env.sh and "
                           f"nnal/atb/set_env.sh): {e}") from e


class NpuBackend(DeviceBackend):
    name = "npu"
    block_sizes = (128,)
    default_max_num_batched_tokens = 8192

    def __init__(self, device: Optional[torch.device] = None):
        if device is None:  # a real NPU; ASCEND_RT_VISIBLE_DEVICES picks which
            _import_torch_npu()
            device = torch.device("npu", torch.npu.current_device())
        self.device = device
        self._mask: Optional[torch.Tensor] = None

    def available_memory_bytes(self) -> int:
        free, _ = torch.npu.mem_get_info(self.device)
        return int(free)

    def default_kv_cache_bytes(self) -> int:
        return accelerator_kv_cache_bytes(self.available_memory_bytes())

    def prepare_attention(self, batch, block_size: int) -> NpuAttentionMetadata:
        dev = self.device
        return NpuAttentionMetadata(
            slot_mapping=torch.from_numpy(batch.slot_mapping.astype("int32")).to(dev),
            block_tables=torch.from_numpy(batch.block_tables.astype("int32")).to(dev),
            context_lens=torch.from_numpy(batch.context_lens.astype("int32")),
            decode=bool((batch.query_lens == 1).all()),
            query_ends=[int(x) for x in batch.query_starts[1:]],
            kv_lens=[int(x) for x in batch.context_lens])

    def write_kv(self, k, v, kv, meta):
        torch.ops.atb._npu_reshape_and_cache(k.contiguous(), v.contiguous(), kv[0], kv[1], meta.slot_mapping)

    def _causal_mask(self) -> torch.Tensor:
        if self._mask is None:
            n = _CAUSAL_MASK_SIZE
            self._mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=self.device), diagonal=1)
        return self._mask

    def attention(self, q, k, v, kv, meta, scale):
        t, h, d = q.shape
        hkv = kv.shape[3]
        if meta.decode:
            out = torch.empty_like(q)
            torch.ops.atb._npu_paged_attention(q.contiguous(), kv[0], kv[1], hkv, h, scale, meta.block_tables,
                                               meta.context_lens, out)
            return out
        nb, bs = kv.shape[1], kv.shape[2]
        out, _ = torch.ops.npu.npu_fused_infer_attention_score(
            q.contiguous(), kv[0].view(nb, bs, hkv * d), kv[1].view(nb, bs, hkv * d), atten_mask=self._causal_mask(),
            actual_seq_lengths=meta.query_ends, actual_seq_lengths_kv=meta.kv_lens, block_table=meta.block_tables,
            num_heads=h, scale=scale, input_layout="TND", num_key_value_heads=hkv, sparse_mode=3, block_size=bs)
        return out

    def rms_norm(self, x, weight, eps):
        return torch.ops.npu.npu_rms_norm(x, weight, eps)[0]

    def add_rms_norm(self, x, residual, weight, eps):
        y, _, total = torch.ops.npu.npu_add_rms_norm(x, residual, weight, eps)  # (norm, rstd, x1 + x2)
        residual.copy_(total)
        return y

    def rotary(self, q, k, positions, cos, sin):
        # npu_rotary_mul wants 4-D [B, S, N, D] and full-width tables (HF's rotate_half layout).
        c = torch.cat([cos[positions], cos[positions]], dim=-1).to(q.dtype)[None, :, None, :]
        s = torch.cat([sin[positions], sin[positions]], dim=-1).to(q.dtype)[None, :, None, :]
        q = torch.ops.npu.npu_rotary_mul(q[None], c, s, "half")[0]
        k = torch.ops.npu.npu_rotary_mul(k[None], c, s, "half")[0]
        return q, k

    def silu_and_mul(self, x):
        return torch.ops.npu.npu_swiglu(x, -1)
