"""The interface every device backend implements: KV-cache layout and allocation, attention
metadata built once per step from the core's batch, and the ops a decoder layer needs.

KV layout (all devices), as the model declares it (KVCacheSpec): per layer, K and V each
[num_blocks, block_size, num_kv_heads, head_dim] (MHA/GQA), or for multi-head latent attention
(DeepSeek) one [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim] tensor, each token's
compressed latent then its rotary key. A token at position p of a stream lives in block
block_table[p // block_size] at offset p % block_size, i.e. at flat slot slot_mapping =
block * block_size + offset, in either layout.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from rtp_llm.config.model_config import ModelRefused


def accelerator_kv_cache_bytes(free_bytes: int) -> int:
    """An accelerator's default KV budget, asked once the weights are in place: 85% of what is
    free, less 1 GiB of headroom for activations, logits and captured graphs (vLLM's
    gpu_memory_utilization plays the same role)."""
    return max(0, int(free_bytes * 0.85) - (1 << 30))


# The smallest budget default_step_tokens picks: fewer prompt tokens a step starve admission at high
# concurrency (docs/serving_benchmarks.md: 2048 at 0.6B, 1024 / 128, c=256).
MIN_STEP_TOKENS = 2048

# torch.distributed's backend for host tensors: the CPU's collectives and, on every device,
# the step-batch broadcasts.
HOST_DIST_BACKEND = "gloo"


class SmallAllReduce(ABC):
    """A device's all-reduce for the small tensors of decode steps (a few KB per layer), faster
    there than its torch.distributed backend's. What create() returns is TPShard.one_shot:
    `(x)` the sum over the ranks (None: x does not fit, nothing done), `send_buffer(shape,
    dtype)` where a producer may write x so that no copy precedes the all-reduce (None: does not
    fit), `add_rms_norm(x, residual, weight, eps)` residual += the sum, returning
    rms_norm(residual) (None: does not apply), and `fused`, whether add_rms_norm may be used."""

    name: str  # for the logs

    @abstractmethod
    def available(self) -> bool:
        """Whether this process may build one now (every rank is asked: all build one or none)."""

    @abstractmethod
    def create(self, group: Any, device: torch.device) -> Any:
        """One for the process group `group`; may raise (then the torch.distributed backend does
        every all-reduce)."""


class HostGate(ABC):
    """Lets the device's stream wait for the host: wait(ticket) queues, on the current stream, a
    wait that holds everything queued behind it until open(ticket) (from any host thread, without
    touching the device) or a later ticket is opened. Tickets come from next(), one per wait, in
    the order they will be opened.

    Invariant a user keeps: every ticket waited on is opened, even when the work it waits for
    fails (else the device stops there for good), and its opener never depends on a thread that
    blocks on this stream holding what the opener needs (the GIL: torch's ops, event waits, graph
    replays and Triton launches release it)."""

    @abstractmethod
    def next(self) -> int:
        ...

    @abstractmethod
    def wait(self, ticket: int) -> None:
        ...

    @abstractmethod
    def open(self, ticket: int) -> None:
        ...

    def counter_address(self) -> Optional[int]:
        """The host address of the 64-bit counter open() stores the ticket to, for a native
        thread to open tickets itself (a release store); None where open() is more than that."""
        return None

    # Whether worker_copy() gives the calls that copy a mask to the device from a native thread.
    copies_on_worker = False

    def worker_copy(self, host: torch.Tensor, dev: torch.Tensor) -> Sequence[Tuple[int, int, int, int]]:
        """The calls (the core's RtpFillCallSpec: call, func, args address, num_args) with which a
        native thread copies host (pinned) into dev (this device's, the same shape) and waits for
        the copy, before it opens a ticket: the work behind the gate then finds the data on the
        device. Where copies_on_worker."""
        raise NotImplementedError


class AttentionMetadata:
    """Backend-specific, built by prepare_inputs() and shared by all layers of a step."""


def sampled_token_rows(batch: Any) -> np.ndarray:
    """The step's tokens whose logits are sampled, in commit order: each do_sample stream's last
    token, or with drafts (speculative decoding) its last 1 + draft_lens tokens (the last known
    token and the drafts: each position's next token verifies the draft after it)."""
    last = batch.query_starts[1:] - 1
    mask = batch.do_sample == 1
    if not batch.num_draft_tokens:
        return last[mask]
    n = 1 + batch.draft_lens[mask]
    first = np.repeat(last[mask] - n + 1, n)
    return first + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)


@dataclass(frozen=True)
class KVCacheSpec:
    """What one token leaves in each layer's cache on this rank, declared by the model
    (DecoderModel.kv_cache_spec): K and V of num_kv_heads x head_dim (latent_dim 0), or MLA's
    latent_dim elements (the latent and the rope key; replicated on every TP rank). The engine
    sizes the pool from block_bytes and the backend allocates it (allocate_cache)."""

    num_layers: int
    num_kv_heads: int = 0
    head_dim: int = 0
    latent_dim: int = 0

    @property
    def is_mla(self) -> bool:
        return self.latent_dim > 0

    def token_elements(self) -> int:
        """Elements per token, all layers."""
        per_layer = self.latent_dim if self.is_mla else 2 * self.num_kv_heads * self.head_dim
        return self.num_layers * per_layer

    def block_bytes(self, block_size: int, dtype: torch.dtype) -> int:
        return self.token_elements() * block_size * torch.tensor([], dtype=dtype).element_size()


@dataclass
class StepInputs:
    """A step's model inputs on the device."""

    token_ids: torch.Tensor              # [T]
    positions: torch.Tensor              # [T]
    meta: AttentionMetadata
    sample_rows: Optional[torch.Tensor]  # [N] rows whose next token is wanted; None: all T rows


class DeviceBackend(ABC):
    name: str
    device: torch.device
    block_sizes: Tuple[int, ...]  # supported KV block sizes; the first is the default
    # Kernels run asynchronously to the host (a device stream), so the engine loop can schedule
    # and prepare a step while the one before runs (overlap), and host copies use pinned memory.
    async_execution: bool = False
    # --max_num_batched_tokens when not given: the per-step token budget. Small on a CPU (a step's
    # time grows with its tokens, so a long prompt chunk would stall the decodes beside it);
    # an accelerator runs thousands of prompt tokens beside its decodes for little more than
    # their own step, and a small budget starves admission at high concurrency.
    default_max_num_batched_tokens: int = 2048
    # The matmul work (FLOPs, this rank's) the prompt tokens of one step should stay under when the
    # budget is not given: the budget is then the largest power of two in [MIN_STEP_TOKENS,
    # default_max_num_batched_tokens] whose tokens stay under it (default_step_tokens), so a big
    # model's prompt chunk holds the decodes beside it for a few of their steps, not ten or more
    # (docs/serving_benchmarks.md: ITL p99 at 8B). None: the default budget whatever the model.
    prefill_step_flops: Optional[float] = None
    # torch.distributed's backend for this device's tensors (the model's collectives).
    dist_backend: str = HOST_DIST_BACKEND

    @classmethod
    def default_step_tokens(cls, token_flops: Optional[float] = None) -> int:
        """--max_num_batched_tokens when not given, for a model whose prompt token costs
        token_flops matmul FLOPs on this rank (None: unknown, the device's default budget)."""
        cap = cls.default_max_num_batched_tokens
        if cls.prefill_step_flops is None or not token_flops:
            return cap
        fits = int(cls.prefill_step_flops // token_flops)
        return max(min(MIN_STEP_TOKENS, cap), min(cap, 1 << max(fits, 1).bit_length() - 1))

    @classmethod
    def rank_device(cls, local_rank: int) -> torch.device:
        """The device of a tensor-parallel rank, the local_rank-th of its node, made the current
        one (the backend, built afterwards, runs there)."""
        return torch.device(cls.name)

    @classmethod
    def prepare_distributed(cls) -> None:
        """Called before the process group starts: settings of the device's collective library."""

    @classmethod
    def small_all_reduce(cls) -> Optional[SmallAllReduce]:
        """None: the torch.distributed backend does every all-reduce."""
        return None

    def host_copy_event(self) -> Any:
        """An event to record after a non-blocking device-to-host copy; its synchronize() waits
        for the copy. None where copies are synchronous."""
        return None

    def host_gate(self) -> Optional[HostGate]:
        """A gate the device's stream can wait on until the host opens it (so work that needs
        host data still being produced queues ahead of it); None where the device has none or
        runs synchronously."""
        return None

    def resolve_placeholders(self, token_ids: torch.Tensor, prev_tokens: torch.Tensor) -> None:
        """In place: token ids -1 - r (placeholders of a step scheduled ahead) become
        prev_tokens[r], the tokens the step before sampled. token_ids: [T], prev_tokens: [N]."""
        idx = (-1 - token_ids).clamp_(min=0)
        token_ids.copy_(torch.where(token_ids < 0, prev_tokens.to(token_ids.dtype)[idx], token_ids))

    # Whether mla_attention runs here (DeepSeek-V2/V3); check_mla() refuses such models otherwise.
    supports_mla: bool = False
    # Whether write_latent and mla_attention run without a host sync (graph capture).
    mla_capturable: bool = False

    def check_mla(self) -> None:
        """Raises, naming the device, where multi-head latent attention does not run."""
        if not self.supports_mla:
            raise ModelRefused(f"MLA kernels for {self.name.upper()} are not built yet: DeepSeek-V2/V3 models "
                             f"(deepseek2, deepseek3) run on --device=cpu and cuda only")

    def kv_cache_dtype(self, name: str, run_dtype: torch.dtype) -> torch.dtype:
        """The KV cache's dtype for --kv_cache_dtype `name` (config/quantization.py KV_CACHE_DTYPES,
        checked against the device already): "auto" the run dtype; a device whose attention reads
        another overrides this."""
        if name != "auto":
            raise ValueError(f"--kv_cache_dtype={name} is not supported on --device={self.name}")
        return run_dtype

    def allocate_cache(self, spec: KVCacheSpec, num_blocks: int, block_size: int, dtype: torch.dtype) -> torch.Tensor:
        """The whole pool in spec's layout: allocate_latent_cache or allocate_kv_cache."""
        if spec.is_mla:
            return self.allocate_latent_cache(spec.num_layers, num_blocks, block_size, spec.latent_dim, dtype)
        return self.allocate_kv_cache(spec.num_layers, num_blocks, block_size, spec.num_kv_heads, spec.head_dim,
                                      dtype)

    def allocate_latent_cache(self, num_layers: int, num_blocks: int, block_size: int, latent_dim: int,
                              dtype: torch.dtype) -> torch.Tensor:
        """MLA: [num_layers, num_blocks, block_size, latent_dim]; [l, b, o] is one token's
        latent (kv_lora_rank) then its rope key (qk_rope_head_dim)."""
        self.check_mla()
        return torch.zeros(num_layers, num_blocks, block_size, latent_dim, dtype=dtype, device=self.device)

    def write_latent(self, entry: torch.Tensor, cache: torch.Tensor, meta: AttentionMetadata) -> None:
        """MLA: entry [T, latent_dim] (this step's tokens) into this layer's cache [blocks,
        block_size, latent_dim] at the step's slots."""
        raise NotImplementedError(f"MLA kernels for {self.name.upper()} are not built yet")

    def mla_attention(self, q_nope: torch.Tensor, q_pe: torch.Tensor, entry: torch.Tensor, cache: torch.Tensor,
                      meta: AttentionMetadata, w_uk: torch.Tensor, w_uv: torch.Tensor, kv_b: torch.Tensor,
                      scale: float) -> torch.Tensor:
        """MLA, causal over each stream's context, after write_latent. q_nope [T, H, dn], q_pe
        [T, H, dr] (rotated); entry [T, kvr + dr] this step's cache rows; w_uk [H, dn, kvr] and
        w_uv [H, kvr, dv] kv_b_proj's key and value halves per head (for absorbing them into the
        query and output: scores = (q_nope w_uk) . latent + q_pe . k_pe); kv_b [kvr, H (dn + dv)]
        the same weights whole (for expanding K/V from the latent). Returns [T, H, dv]."""
        raise NotImplementedError(f"MLA kernels for {self.name.upper()} are not built yet")

    def allocate_kv_cache(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                          dtype: torch.dtype) -> torch.Tensor:
        """[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]; [l, 0] is K, [l, 1] is V."""
        return torch.zeros(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype,
                           device=self.device)

    @abstractmethod
    def available_memory_bytes(self) -> int:
        """Memory the KV cache may use when no budget is configured."""

    def default_kv_cache_bytes(self) -> int:
        """The KV cache budget when --kv_cache_mem_mb is not given (asked after the weights
        are in place): a quarter of what is free, at most 4 GiB."""
        return min(self.available_memory_bytes() // 4, 4 << 30)

    def release_memory(self) -> None:
        """Called once the engine dropped its tensors: hand cached memory back to the device."""

    def bind_model(self, num_heads: int, num_kv_heads: int, head_dim: int, max_batch_size: int,
                   max_seq_len: int) -> None:
        """Told once, before the first step, the shapes it will run (to size workspaces)."""

    def prepare_attention(self, batch: Any, block_size: int) -> AttentionMetadata:
        """From a core StepBatch (numpy views, valid only for this step): what the default
        prepare_inputs() asks for. A backend that overrides prepare_inputs() need not have it."""
        raise NotImplementedError(f"{type(self).__name__} builds its attention metadata in prepare_inputs()")

    def prepare_inputs(self, batch: Any, block_size: int) -> StepInputs:
        """Token ids, positions, attention metadata and sampled rows of a StepBatch, on the device
        (the only call the engine makes per step)."""
        rows = sampled_token_rows(batch)
        return StepInputs(torch.from_numpy(batch.token_ids.astype(np.int64)).to(self.device),
                          torch.from_numpy(batch.positions.astype(np.int64)).to(self.device),
                          self.prepare_attention(batch, block_size),
                          torch.from_numpy(rows.astype(np.int64)).to(self.device))

    def make_graph_runner(self, model: Any, kv_cache: torch.Tensor, block_size: int, max_batch_size: int,
                          max_seq_len: int, max_num_batched_tokens: int, max_sampled_rows: int = 0) -> Any:
        """Something whose run(batch) replays a captured step and returns its logits (None when
        no captured graph fits the batch), or None where the device has no graphs.
        max_sampled_rows: a step's most sampled rows (0: max_batch_size)."""
        return None

    def make_head_graphs(self, head: Any, kv_cache: torch.Tensor, block_size: int, max_streams: int,
                         max_seq_len: int, dtype: torch.dtype, max_chain: int) -> Any:
        """A drafting head's chains of up to max_chain draft steps captured (run(tokens, hidden,
        positions, slots, block_tables) -> drafts [steps, streams], or None where none fits:
        device/cuda/head_graphs.py), or None where the device has no graphs."""
        return None

    @abstractmethod
    def write_kv(self, k: torch.Tensor, v: torch.Tensor, kv: torch.Tensor, meta: AttentionMetadata) -> None:
        """k, v: [T, num_kv_heads, head_dim] into this layer's cache kv: [2, blocks, block_size, heads, dim]."""

    @abstractmethod
    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: torch.Tensor, meta: AttentionMetadata,
                  scale: float) -> torch.Tensor:
        """q: [T, num_heads, head_dim] -> [T, num_heads, head_dim]; causal over each stream's
        context. k, v: this step's [T, num_kv_heads, head_dim], already written to kv."""

    def keeps_quantized(self, weight: Any) -> bool:
        """Whether pack_linear / pack_gate_up / pack_lm_head take this quantized checkpoint
        tensor (model_loader.quantized) as it is; the decoder widens it to the run dtype
        otherwise. Default: no device computes on quantized weights."""
        return False

    def pack_linear(self, weight: torch.Tensor) -> torch.Tensor:
        """A projection weight, HF's [out, in], in the layout linear() wants. Default: [in, out]
        contiguous, applied as x @ w (on the CPU faster than F.linear for decode-sized batches)."""
        return weight.t().contiguous()

    def linear(self, x: torch.Tensor, weight: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: [T, in] -> [T, out], weight from pack_linear(); into `out` (contiguous) when given."""
        return torch.matmul(x, weight, out=out)

    def pack_gate_up(self, weight: torch.Tensor) -> torch.Tensor:
        """The MLP's gate and up projections, [2 I, hidden] (gate rows, then up rows), in the
        layout gate_up_silu() wants. Default: pack_linear()."""
        return self.pack_linear(weight)

    def gate_up_silu(self, x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
        """The MLP's first half: silu(x gate^T) * (x up^T), [T, hidden] -> [T, I]; gate_up
        from pack_gate_up()."""
        return self.silu_and_mul(self.linear(x, gate_up))

    def moe_route(self, router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool):
        """Qwen-MoE's routing, models_py/moe.py route() (its contract; the default), which a
        backend may fuse."""
        from rtp_llm.models_py.moe import route

        return route(router_logits, top_k, norm_topk_prob)

    # Whether moe() runs without a host sync (a step with it can be captured in a graph).
    moe_capturable = False

    def moe(self, x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
            topk_ids: torch.Tensor) -> torch.Tensor:
        """A MoE MLP's routed experts: out[t] = sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]),
        expert e(x) = silu(x g_e^T) * (x u_e^T) @ d_e^T. x: [T, hidden]; gate_up: [E, 2 I, hidden]
        (expert e's gate rows, then its up rows); down: [E, hidden, I]; topk_weights: [T, K] in
        x's dtype; topk_ids: [T, K] int64. Returns [T, hidden] in x's dtype. Default: moe_reference
        (torch ops; its per-expert slice bounds reach the host, so a step with it is not
        capturable in a graph: moe_capturable)."""
        return moe_reference(x, gate_up, down, topk_weights, topk_ids, self.silu_and_mul)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [N, V] fp32 -> [N] int64, each row's first largest (greedy sampling)."""
        return logits.argmax(dim=-1)

    def apply_token_bitmask(self, logits: torch.Tensor, rows: torch.Tensor, bits: torch.Tensor) -> None:
        """Grammars: apply_token_bitmask below (torch ops, any device) unless a device has better."""
        apply_token_bitmask(logits, rows, bits)

    def pack_lm_head(self, weight: torch.Tensor) -> torch.Tensor:
        """The LM head [vocab, hidden] in the layout lm_head() wants (default: as is, which
        for tied embeddings shares the embedding table)."""
        return weight

    def lm_head(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """h: [N, hidden] -> logits [N, vocab] (the model dtype)."""
        return torch.nn.functional.linear(h, weight)

    @abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x: [N, D], weight: [D] (HF semantics: normalize in fp32, cast, then scale)."""

    @abstractmethod
    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2 * I] (gate then up) -> [T, I]."""

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """residual += x (in place); returns rms_norm(residual). x, residual: [N, D]."""
        residual.add_(x)
        return self.rms_norm(residual, weight, eps)

    def qkv_to_cache(self, qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                     q_norm: Optional[torch.Tensor], k_norm: Optional[torch.Tensor], eps: float,
                     positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: torch.Tensor,
                     meta: AttentionMetadata):
        """qkv: [T, (H + 2 Hkv) D], the fused projection. Applies the optional per-head RMSNorm
        of q and k (Qwen3; weights [D]) and rotary, writes k and v to this layer's cache kv;
        returns q [T, H, D], k and v [T, Hkv, D] for attention(). Backends may fuse it."""
        t = qkv.shape[0]
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        q = qkv[:, :q_size].reshape(t, num_heads, head_dim)
        k = qkv[:, q_size:q_size + kv_size].reshape(t, num_kv_heads, head_dim)
        v = qkv[:, q_size + kv_size:].reshape(t, num_kv_heads, head_dim)
        if q_norm is not None:
            q = self.rms_norm(q.reshape(-1, head_dim), q_norm, eps).view_as(q)
            k = self.rms_norm(k.reshape(-1, head_dim), k_norm, eps).view_as(k)
        q, k = self.rotary(q, k, positions, cos, sin)
        self.write_kv(k, v, kv, meta)
        return q, k, v

    def rotary(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor):
        """q: [T, H, D], k: [T, Hkv, D], positions: [T]; cos/sin: [max_positions, D/2] fp32.
        Returns the rotated q, k (HF's rotate_half layout); may rotate in place."""
        c, s = cos[positions], sin[positions]
        return _rotate(q, c, s), _rotate(k, c, s)


def moe_reference(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, silu_and_mul) -> torch.Tensor:
    """DeviceBackend.moe in torch ops, tokens grouped by expert: the T K (token, expert) pairs
    sorted by expert, one pair of GEMMs per expert over its contiguous slice of rows, each row
    scaled by its routing weight, then back in (token, k) order and summed over k (HF's own
    reduction, transformers' grouped_mm experts: deterministic, unlike index_add_ on GPUs;
    summed with fp32 accumulation, rounded once to x's dtype)."""
    t, k = topk_ids.shape
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)                                # [T K] pairs by expert
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()     # the slices' lengths
    rows = x[order // k]                                                     # [T K, hidden]
    out = torch.empty_like(rows)
    start = 0
    for e, n in enumerate(counts):
        if n:
            out[start:start + n] = F.linear(silu_and_mul(F.linear(rows[start:start + n], gate_up[e])), down[e])
            start += n
    out *= topk_weights.reshape(-1)[order].unsqueeze(1)
    pairs = torch.empty_like(out)
    pairs[order] = out                                                       # (token, k) order again
    return pairs.view(t, k, x.shape[1]).sum(dim=1)


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bits: torch.Tensor) -> None:
    """In place: logits [N, V] fp32; rows `rows` ([G] int64) keep the tokens whose bit is set in
    bits [G, ceil(V/32)] int32 (bit j of word w: token 32 w + j, xgrammar's layout) and the
    others become -inf; the other rows are untouched."""
    masks = _BIT_MASKS.get(bits.device)
    if masks is None:
        masks = _BIT_MASKS[bits.device] = torch.tensor([int32_bit(j) for j in range(32)], dtype=torch.int32,
                                                         device=bits.device)
    allowed = ((bits.unsqueeze(-1) & masks) != 0).view(bits.shape[0], -1)[:, :logits.shape[1]]  # [G, V]
    logits[rows] = torch.where(allowed, logits[rows], -float("inf"))


_BIT_MASKS = {}  # device -> [32] int32: bit j of a word


def int32_bit(j: int) -> int:
    """Bit j of an int32 word as a Python int that fits int32 (bit 31 is the sign)."""
    return -(1 << 31) if j == 31 else 1 << j


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    cos = cos.unsqueeze(1).to(x.dtype)
    sin = sin.unsqueeze(1).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
