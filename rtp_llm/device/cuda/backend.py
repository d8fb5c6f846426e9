"""CUDA backend: Triton kernels (rtp_llm.device.cuda.kernels) for attention over the paged KV
cache, the cache write, rotary, RMSNorm with fused residual add, SiLU-and-mul, small-batch
projections (GEMV), FP8, GPTQ and AWQ checkpoints' projections, MoE's routing and routed
experts (grouped GEMMs) and DeepSeek's latent attention; cuBLAS (torch) for the other GEMMs. A
step's integer inputs reach the GPU in one copy from a pinned buffer."""

import gc
import os
from typing import Optional

import numpy as np
import torch

from rtp_llm.device.base import (DeviceBackend, SmallAllReduce, StepInputs, accelerator_kv_cache_bytes,
                                 sampled_token_rows)
from rtp_llm.device.cuda import kernels as K
from rtp_llm.device.cuda.graph_runner import CudaGraphRunner
from rtp_llm.device.cuda.host_gate import CudaHostGate
from rtp_llm.device.cuda.metadata import CudaAttentionMetadata, DecodeRows, LatentContext
from rtp_llm.model_loader.fp8_weight import Fp8Tensor
from rtp_llm.model_loader.int_weight import GroupIntTensor


class CudaBackend(DeviceBackend):
    name = "cuda"
    block_sizes = (16, 32, 64)
    async_execution = True
    dist_backend = "nccl"
    default_max_num_batched_tokens = 8192
    # ~55 ms of prompt chunk at the bf16 GEMM rate an H200 reached on Qwen3-8B's prompts: 2048
    # tokens for an 8B model, 8192 up to ~2B parameters (docs/serving_benchmarks.md, session 22).
    prefill_step_flops = 3.2e13

    @classmethod
    def rank_device(cls, local_rank: int) -> torch.device:
        """One GPU per local rank (CUDA_VISIBLE_DEVICES picks which)."""
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)

    @classmethod
    def prepare_distributed(cls) -> None:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (shared machines)

    @classmethod
    def small_all_reduce(cls) -> Optional[SmallAllReduce]:
        """Symmetric memory (rtp_llm.device.cuda.all_reduce) unless RTP_LLM_ONE_SHOT_ALL_REDUCE=0:
        NCCL's ring takes several times its latency at decode sizes."""
        if os.environ.get("RTP_LLM_ONE_SHOT_ALL_REDUCE", "1") == "0":
            return None
        from rtp_llm.device.cuda.all_reduce import SYMMETRIC_MEMORY  # tensor parallelism only

        return SYMMETRIC_MEMORY

    def __init__(self, device_index: Optional[int] = None):
        if not torch.cuda.is_available():
            raise RuntimeError("--device=cuda: torch sees no CUDA GPU (torch.cuda.is_available() is False)")
        self.device = torch.device("cuda", torch.cuda.current_device() if device_index is None else device_index)
        torch.cuda.set_device(self.device)
        self.num_sms = K.num_sms(self.device)
        self._pinned = torch.empty(1 << 16, dtype=torch.int32, pin_memory=True)
        self._copied: Optional[torch.cuda.Event] = torch.cuda.Event()
        self._ws: Optional[K.DecodeWorkspace] = None
        self._ws_shape = (0, 0, 0, 0)
        # Outgrown workspaces stay allocated: a captured graph may still use their buffers (its
        # split counters must stay zeroed memory of its own).
        self._retired_ws = []
        self._gate = CudaHostGate.create(self.device) if os.environ.get("RTP_LLM_HOST_GATE", "1") != "0" else None
        self._mla = False  # the cache is MLA's latent one (allocate_latent_cache)
        self._mla_ws: Optional[K.DecodeWorkspace] = None

    def host_copy_event(self):
        return torch.cuda.Event()

    def host_gate(self):
        """The backend's CudaHostGate (None where the driver has no 64-bit stream waits, or with
        RTP_LLM_HOST_GATE=0: then a grammar step's sampling waits for its mask on the host)."""
        return self._gate

    def resolve_placeholders(self, token_ids, prev_tokens):
        K.resolve_placeholders(token_ids, prev_tokens)

    def apply_token_bitmask(self, logits, rows, bits):
        K.apply_token_bitmask(logits, rows, bits)

    def available_memory_bytes(self) -> int:
        """Free device memory once torch's allocator gave back what it holds unused: tensors freed
        while loading (e.g. a checkpoint's per-expert tensors once stacked on the GPU) stay
        reserved by it otherwise, and the KV cache would be sized without them."""
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.device)
        return int(free)

    def default_kv_cache_bytes(self) -> int:
        return accelerator_kv_cache_bytes(self.available_memory_bytes())

    def reserve_decode_workspace(self, max_batch_size: int, num_heads: int, head_dim: int, max_splits: int):
        want = (max_batch_size, num_heads, head_dim, max_splits)
        if self._ws is None or any(w > h for w, h in zip(want, self._ws_shape)):
            self._ws_shape = tuple(max(w, h) for w, h in zip(want, self._ws_shape))
            if self._ws is not None:
                self._retired_ws.append(self._ws)
            self._ws = K.DecodeWorkspace(*self._ws_shape, self.device)

    # ------------------------------------------------------------------ step inputs

    def prepare_inputs(self, batch, block_size: int) -> StepInputs:
        t, s = len(batch.token_ids), int(batch.num_streams)
        one = batch.query_lens == 1
        decode = bool(one.all())
        split = not decode and bool(one.any())  # a mixed step: see DecodeRows
        expand = self._mla and K.mla_expands(batch.query_lens)  # (eager steps only: see kernels/mla.py)
        rows = sampled_token_rows(batch)
        sample_all = len(rows) == t
        empty = rows[:0]
        tiles = empty if decode else K.extend_tiles(np.where(one, 0, batch.query_lens) if split else batch.query_lens)
        parts = [batch.token_ids, batch.positions, batch.slot_mapping, batch.query_starts, batch.context_lens,
                 batch.block_tables.reshape(-1), rows if not sample_all else empty, tiles.reshape(-1),
                 batch.query_starts[:-1][one] if split else empty, batch.context_lens[one] if split else empty,
                 batch.block_tables[one].reshape(-1) if split else empty]
        if expand:
            parts += K.context_slots(~one, batch.context_lens, batch.block_tables, block_size)
        # Every part starts 16-byte aligned: Triton specializes kernels on pointer alignment,
        # and a part's alignment would otherwise change with the step's shape.
        offsets = np.cumsum([0] + [-(-len(p) // 4) * 4 for p in parts])
        total = int(offsets[-1])
        # The last copy out of the staging buffer must have run before it is rewritten: a step
        # that samples nothing (a prompt chunk) ends without a sync.
        if self._copied is not None:
            self._copied.synchronize()
        if total > len(self._pinned):
            self._pinned = torch.empty(2 * total, dtype=torch.int32, pin_memory=True)
        host = self._pinned.numpy()
        for p, off in zip(parts, offsets):
            host[off: off + len(p)] = p
        dev = self._pinned[:total].to(self.device, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        views = [dev[off: off + len(p)] for p, off in zip(parts, offsets)]
        max_ctx = int(batch.context_lens.max()) if s else 0
        meta = CudaAttentionMetadata(
            slot_mapping=views[2], block_tables=views[5].view(s, -1), query_starts=views[3], context_lens=views[4],
            decode_splits=self.decode_splits(s, max_ctx) if decode else 0,
            tiles=None if decode else views[7].view(2, -1))
        if split:
            d = len(views[9])
            meta.decode_rows = DecodeRows(views[8], views[9], views[10].view(d, -1),
                                          self.decode_splits(d, int(batch.context_lens[one].max())))
        if expand:
            meta.latent_context = LatentContext(views[11], views[12])
        return StepInputs(views[0], views[1], meta, None if sample_all else views[6])

    # ------------------------------------------------------------------ ops

    def bind_model(self, num_heads: int, num_kv_heads: int, head_dim: int, max_batch_size: int, max_seq_len: int):
        self._heads, self._kv_heads = num_heads, num_kv_heads
        if not self._mla:  # (MLA's latent-wide partials: reserved by its first decode step)
            self.reserve_decode_workspace(max_batch_size, num_heads, head_dim, self.decode_splits(1, max_seq_len))

    def _mla_workspace(self, partials: int, kvr: int) -> K.DecodeWorkspace:
        """MLA's split partials, sized by their count (rows x heads x splits: decode_splits keeps
        it near twice the SMs' worth whatever the batch), grown as needed."""
        if self._mla_ws is None or self._mla_ws.lse.numel() < partials:
            if self._mla_ws is not None:
                self._retired_ws.append(self._mla_ws)
            self._mla_ws = K.DecodeWorkspace(1, partials, kvr, 1, self.device)
        return self._mla_ws

    def decode_splits(self, num_streams: int, max_context: int) -> int:
        """Context splits of a decode step (CudaAttentionMetadata.decode_splits): the paged
        kernel's by KV head, or MLA's by head block."""
        if self._mla:
            return K.mla_decode_splits(num_streams, self._heads, max_context, self.num_sms)
        return K.decode_splits(num_streams, self._kv_heads, max_context, self.num_sms)

    def write_kv(self, k, v, kv, meta):
        K.store_kv(k, v, kv, meta.slot_mapping)

    def attention(self, q, k, v, kv, meta, scale):
        out = torch.empty_like(q)
        if meta.decode_splits:
            s = meta.context_lens.shape[0]
            self.reserve_decode_workspace(s, q.shape[1], q.shape[2], meta.decode_splits)
            K.decode_attention(q, kv, meta.block_tables, meta.query_starts, meta.context_lens, scale,
                               meta.decode_splits, self._ws, out)
        else:
            K.extend_attention(q, kv, meta.block_tables, meta.query_starts, meta.context_lens, meta.tiles, scale,
                               out)
            d = meta.decode_rows
            if d is not None:
                self.reserve_decode_workspace(d.context_lens.shape[0], q.shape[1], q.shape[2], d.splits)
                K.decode_attention(q, kv, d.block_tables, d.rows, d.context_lens, scale, d.splits, self._ws, out)
        return out

    def qkv_to_cache(self, qkv, num_heads, num_kv_heads, head_dim, q_norm, k_norm, eps, positions, cos, sin, kv,
                     meta):
        K.qkv_to_cache(qkv, num_heads, num_kv_heads, head_dim, q_norm, k_norm, eps, positions, cos, sin, kv,
                       meta.slot_mapping)
        t, q_size, kv_size = qkv.shape[0], num_heads * head_dim, num_kv_heads * head_dim
        return (qkv[:, :q_size].view(t, num_heads, head_dim),
                qkv[:, q_size:q_size + kv_size].view(t, num_kv_heads, head_dim),
                qkv[:, q_size + kv_size:].view(t, num_kv_heads, head_dim))

    # Projections: decode batches of 1 (and 2-4 for narrow outputs) run the Triton gemv over
    # HF's [out, in] weights (faster than cuBLAS's GEMV kernels there: kernels.use_gemv), the
    # rest cuBLAS via F.linear. fp32 (the parity reference) keeps cuBLAS, i.e. HF's very sums.
    # An FP8 checkpoint's projections with one scale per row (per-tensor, per-channel) stay FP8
    # on Hopper GPUs (kernels/fp8.py) in a bf16 run; an fp16 or fp32 run widens
    # them (the exact reference), as does RTP_LLM_CUDA_FP8=0 (to compare against). Block-scaled
    # ones (Qwen3-*-FP8, DeepSeek-V3) are widened unless RTP_LLM_CUDA_FP8_BLOCK=1: their kernels
    # are still slower than bf16's on the H200 (docs/benchmarks.md, "FP8 checkpoints").
    def supports_fp8(self) -> bool:
        """FP8 weights: Hopper (cuBLASLt's row-wise scaled FP8 GEMM is SM90's in torch)."""
        return (os.environ.get("RTP_LLM_CUDA_FP8", "1") != "0"
                and torch.cuda.get_device_capability(self.device) >= (9, 0))

    # --kv_cache_dtype=fp8 (fp8_e4m3 too): K and V stored as e4m3 with scale 1 (as vLLM's fp8
    # cache without checkpoint scales), saturated at +-448 (row_ops._cached); the attention
    # kernels widen them to the queries' dtype. Half the bytes a token of bf16's.
    def kv_cache_dtype(self, name, run_dtype):
        if name == "auto":
            return run_dtype
        if torch.cuda.get_device_capability(self.device) < (8, 9):
            raise ValueError(f"--kv_cache_dtype={name} needs a GPU with FP8 (compute capability 8.9+)")
        return torch.float8_e4m3fn

    # GPTQ / AWQ projections stay packed in bf16 and fp16 runs, a quarter of bf16's bytes at 4 bits:
    # repacked for the tensor cores where kernels/wint_mma.py takes them, else read as stored
    # (kernels/wint.py's Triton kernels); an fp32 run widens them (the exact reference), as does
    # RTP_LLM_CUDA_WINT=0 (to compare against).
    def keeps_quantized(self, weight):
        if isinstance(weight, GroupIntTensor):
            return (weight.dtype in (torch.bfloat16, torch.float16) and os.environ.get("RTP_LLM_CUDA_WINT", "1") != "0"
                    and K.wint_supports(weight.shape[1], weight.group, weight.bits))
        if not (isinstance(weight, Fp8Tensor) and weight.dtype == torch.bfloat16):
            return False  # (cuBLASLt's row-wise scaled GEMM writes bf16 only)
        if not (weight.row_scaled or os.environ.get("RTP_LLM_CUDA_FP8_BLOCK") == "1"):
            return False
        return self.supports_fp8() and K.fp8_supports(*weight.shape, weight.block)

    def pack_linear(self, weight):
        if isinstance(weight, GroupIntTensor):
            t = weight.to(self.device)
            packed = K.IntLinear(t.blocks.contiguous(), t.scale.contiguous(), t.zero.contiguous(), t.perm, t.group,
                                 t.bits, t.shape[1])
            return K.int4_mma_pack(packed, t.dtype) if K.int4_mma_supports(packed, t.dtype) else packed
        if isinstance(weight, Fp8Tensor):
            return K.Fp8Linear(weight.blocks.to(self.device).contiguous(), weight.scale.to(self.device).contiguous(),
                               weight.block)
        return weight.to(self.device).contiguous()  # (a stack widened from kept parts is still on the host)

    def linear(self, x, weight, out=None):
        if isinstance(weight, K.Fp8Linear):
            return K.fp8_linear(x, weight, out=out)
        if isinstance(weight, K.IntLinear):
            return K.wint_linear(x, weight, out=out)
        if isinstance(weight, K.Int4Mma):
            return K.int4_mma_linear(x, weight, out=out)
        if K.use_gemv(x, weight):
            return K.gemv(x, weight, out=out)
        if out is None:
            return torch.nn.functional.linear(x, weight)
        return torch.mm(x, weight.t(), out=out)  # F.linear's very product

    def gate_up_silu(self, x, gate_up):
        if isinstance(gate_up, K.Fp8Linear):
            return K.fp8_gate_up_silu(x, gate_up, self.silu_and_mul)
        if isinstance(gate_up, K.IntLinear):
            return K.wint_gate_up_silu(x, gate_up, self.silu_and_mul)
        if isinstance(gate_up, K.Int4Mma):
            return K.int4_mma_gate_up_silu(x, gate_up, self.silu_and_mul)
        if K.use_gemv(x, gate_up):
            return K.gemv(x, gate_up, gated=True)  # SiLU-and-mul in the GEMV's epilogue
        return super().gate_up_silu(x, gate_up)

    moe_capturable = True
    supports_mla = True
    mla_capturable = True

    def allocate_latent_cache(self, num_layers, num_blocks, block_size, latent_dim, dtype):
        self._mla = True  # decode splits by head block; eager prompt steps expand (kernels/mla.py)
        return super().allocate_latent_cache(num_layers, num_blocks, block_size, latent_dim, dtype)

    def write_latent(self, entry, cache, meta):
        K.store_latent(entry, cache, meta.slot_mapping)

    def mla_attention(self, q_nope, q_pe, entry, cache, meta, w_uk, w_uv, kv_b, scale):
        if meta.decode_splits > 1:  # a decode step: each row's context in splits
            ws = self._mla_workspace(q_nope.shape[0] * q_nope.shape[1] * meta.decode_splits, w_uk.shape[2])
            return K.mla_attention(q_nope, q_pe, cache, meta.block_tables, meta.query_starts, meta.context_lens,
                                   w_uk, w_uv, scale, splits=meta.decode_splits, ws=ws)
        lc = meta.latent_context
        if lc is None:  # the absorbed form for every row (kernels/mla.py)
            return K.mla_attention(q_nope, q_pe, cache, meta.block_tables, meta.query_starts, meta.context_lens,
                                   w_uk, w_uv, scale)
        out = q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], w_uv.shape[2])
        K.mla_prefill(q_nope, q_pe, cache, lc.slots, lc.starts, meta.query_starts, meta.context_lens, meta.tiles,
                      kv_b, scale, out)  # the prompt rows, expanded
        d = meta.decode_rows
        if d is not None:  # a mixed step's one-token rows, absorbed
            out.index_copy_(0, d.rows.long(), K.mla_attention(q_nope, q_pe, cache, meta.block_tables,
                                                              meta.query_starts, meta.context_lens, w_uk, w_uv,
                                                              scale, rows=d.rows))
        return out

    def moe_route(self, router_logits, top_k, norm_topk_prob):
        return K.moe_route(router_logits, top_k, norm_topk_prob)  # softmax, top-k, renormalization: one launch

    def moe(self, x, gate_up, down, topk_weights, topk_ids):
        return K.moe(x, gate_up, down, topk_weights, topk_ids)  # grouped by expert on the device

    def rms_norm(self, x, weight, eps):
        return K.rms_norm(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):
        return K.rms_norm(x, weight, eps, residual=residual)

    def rotary(self, q, k, positions, cos, sin):
        K.rotary(q, k, positions, cos, sin)
        return q, k

    def silu_and_mul(self, x):
        return K.silu_and_mul(x)

    def make_graph_runner(self, model, kv_cache, block_size: int, max_batch_size: int, max_seq_len: int,
                          max_num_batched_tokens: int, max_sampled_rows: int = 0):
        return CudaGraphRunner(model, self, kv_cache, block_size, max_batch_size, max_seq_len,
                               max_num_batched_tokens, max_sampled_rows)

    def make_head_graphs(self, head, kv_cache, block_size: int, max_streams: int, max_seq_len: int, dtype,
                         max_chain: int):
        from rtp_llm.device.cuda.head_graphs import HeadGraphRunner

        return HeadGraphRunner(head, self, kv_cache, block_size, max_streams, max_seq_len, dtype, max_chain)

    def release_memory(self):
        self._ws = self._mla_ws = None
        self._ws_shape = (0, 0, 0, 0)
        self._retired_ws = []
        gc.collect()  # captured graphs hold their pool until collected
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()

    def synchronize(self):
        torch.cuda.synchronize(self.device)
